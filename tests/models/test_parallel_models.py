"""Checks of the local ModelSpec builders (tests/helpers/parallel_models.py) the layout tests use: parameter and
tensor counts of the real architectures."""

from __future__ import annotations

from helpers.parallel_models import deepseek_v3, llama_8b, llama_70b, qwen3_30b, qwen3_235b


# ---------------------------------------------------------------------------- checks of the helper
def test_llama_counts():
    m = llama_70b()
    assert m.num_params == 70_553_706_496 and len(m.tensors) == 723
    assert llama_8b().num_bytes == 16_060_522_496


def test_qwen3_235b_counts():
    m = qwen3_235b()
    assert m.num_params == 235_093_634_560 and len(m.tensors) == 36_945
    assert qwen3_30b().num_params == 30_532_122_624


def test_deepseek_counts():
    main = deepseek_v3(mtp=0)
    assert sum(t.numel for t in main.tensors if t.kind != "scale_inv") == 671_026_419_200
    full = deepseek_v3()
    assert full.num_params == 684_531_386_000 and len(full.tensors) == 91_991


# ---------------------------------------------------------------------------- engineer "archs1"
def test_archs1_builders_equal_the_catalog_inventory():
    """The layout tests' independent builders (helpers/parallel_models.py) and reshardctl's tables agree on every
    name, shape and kind of the same Qwen2 / Qwen2-MoE / Mixtral configs."""
    from helpers.parallel_models import tiny_mixtral, tiny_qwen2, tiny_qwen2_moe
    from reshardctl.models import spec_from_config

    common = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=3,
                  tie_word_embeddings=False)
    configs = {
        tiny_qwen2: dict(common, architectures=["Qwen2ForCausalLM"], vocab_size=1000, intermediate_size=128),
        tiny_qwen2_moe: dict(common, architectures=["Qwen2MoeForCausalLM"], vocab_size=1003, intermediate_size=128,
                             num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                             mlp_only_layers=[0]),
        tiny_mixtral: dict(common, architectures=["MixtralForCausalLM"], vocab_size=1000, intermediate_size=64,
                           num_local_experts=8),
    }
    for builder, cfg in configs.items():
        ours = {t.name: (t.shape, t.kind, t.expert) for t in builder(layers=3).tensors}
        theirs = {t.name: (t.shape, t.kind, t.expert) for t in spec_from_config(cfg, "x").tensors}
        assert ours == theirs, (builder.__name__, sorted(set(ours) ^ set(theirs))[:6])
        assert builder(layers=3).dims.moe_layers == spec_from_config(cfg, "x").dims.moe_layers
