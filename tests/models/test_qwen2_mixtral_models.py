"""Qwen2 / Qwen2.5, Qwen2-MoE and Mixtral checkpoints (engineer "archs1"): exact parameter counts of the shipped
presets against the published totals, the inventory rules of the transformers modelling code, and configs that
must be refused with the file and the key named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import ModelError
from reshardctl.models import load_model, spec_from_config
from reshardctl.models.catalog import preset_config

# Published totals. The Hugging Face Hub's safetensors metadata ("safetensors": {"total": N}, the exact element
# count of the checkpoint; for Qwen2.5-7B-Instruct also model.safetensors.index.json total_size 15,231,233,024
# bytes / 2 bytes per bf16 element):
#   Qwen/Qwen2.5-7B-Instruct 7,615,616,512 (model card: 7.61B); Qwen/Qwen2.5-72B-Instruct 72,706,203,648 (72.7B);
#   Qwen/Qwen2-57B-A14B 57,408,658,944 (57B; the -Instruct checkpoint has the same shapes);
#   mistralai/Mixtral-8x7B-v0.1 46,702,792,704 (46.7B).
PUBLISHED = {
    "qwen2.5-7b": (7_615_616_512, 339),
    "qwen2.5-72b": (72_706_203_648, 963),
    "qwen2-57b-a14b": (57_408_658_944, 5_771),
    "mixtral-8x7b": (46_702_792_704, 995),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_counts_equal_the_published_totals(name):
    m = load_model(name)
    params, tensors = PUBLISHED[name]
    assert (m.num_params, len(m.tensors)) == (params, tensors)
    assert m.num_bytes == 2 * params  # bf16


def test_qwen2_dense_inventory():
    """modeling_qwen2.py Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False; head_dim = H / nh."""
    m = load_model("qwen2.5-7b", layers=1)
    got = {t.name: t.shape for t in m.tensors if ".self_attn." in t.name}
    assert got == {
        "model.layers.0.self_attn.q_proj.weight": (3584, 3584), "model.layers.0.self_attn.q_proj.bias": (3584,),
        "model.layers.0.self_attn.k_proj.weight": (512, 3584), "model.layers.0.self_attn.k_proj.bias": (512,),
        "model.layers.0.self_attn.v_proj.weight": (512, 3584), "model.layers.0.self_attn.v_proj.bias": (512,),
        "model.layers.0.self_attn.o_proj.weight": (3584, 3584)}
    assert m.dims.head_dim == 128 and m.tensor("model.layers.0.self_attn.k_proj.bias").kind == "k_bias"


def test_qwen2_moe_inventory_and_sparse_layers():
    """modeling_qwen2_moe.py: MoE iff l not in mlp_only_layers and (l+1) % decoder_sparse_step == 0; a MoE layer
    holds mlp.gate, experts, one shared_expert of shared_expert_intermediate_size and shared_expert_gate [1, H]."""
    cfg = dict(preset_config("tiny-qwen2-moe"), num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    m = spec_from_config(cfg, "x")
    assert m.dims.moe_layers == (1, 5)
    assert m.tensor("model.layers.0.mlp.gate_proj.weight").shape == (1536, 512)  # dense: intermediate_size
    assert m.tensor("model.layers.5.mlp.shared_expert.down_proj.weight").shape == (512, 1024)
    assert m.tensor("model.layers.5.mlp.shared_expert_gate.weight").shape == (1, 512)
    assert m.tensor("model.layers.5.mlp.experts.15.up_proj.weight").shape == (256, 512)
    assert "model.layers.3.mlp.gate.weight" not in {t.name for t in m.tensors}
    d = load_model("qwen2-57b-a14b", layers=1).dims
    assert d.num_experts == 64 and d.moe_intermediate * d.num_shared_experts == 20480


def test_mixtral_inventory():
    """modeling_mixtral.py: every layer MoE, block_sparse_moe.gate [E, H], experts.{e}.w1/w3 [I, H], w2 [H, I]."""
    m = load_model("mixtral-8x7b", layers=1)
    names = [t.name for t in m.tensors if ".block_sparse_moe." in t.name]
    assert names[:4] == ["model.layers.0.block_sparse_moe.gate.weight",
                         "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                         "model.layers.0.block_sparse_moe.experts.0.w2.weight",
                         "model.layers.0.block_sparse_moe.experts.0.w3.weight"]
    kinds = {t.name.rsplit(".", 2)[1]: (t.kind, t.shape) for t in m.tensors if ".experts.7." in t.name}
    assert kinds == {"w1": ("expert_gate", (14336, 4096)), "w3": ("expert_up", (14336, 4096)),
                     "w2": ("expert_down", (4096, 14336))}
    assert m.dims.moe_layers == (0,) and m.dims.intermediate == 0 and m.dims.moe_intermediate == 14336
    assert not any(t.kind.startswith("mlp_") for t in m.tensors)


def test_tiny_presets_are_shape_faithful():
    q = load_model("tiny-qwen2-moe").dims
    assert q.moe_layers == (1, 2, 3) and q.num_kv_heads == 2 and q.num_shared_experts * q.moe_intermediate == 1024
    x = load_model("tiny-mixtral").dims
    assert x.moe_layers == (0, 1, 2, 3) and x.num_experts == 8
    for p in ("tiny-qwen2-moe", "tiny-mixtral"):
        assert 10e6 < load_model(p).num_bytes < 400e6


@pytest.mark.parametrize("preset,edit,key,problem", [
    ("tiny-qwen2-moe", {"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size", "is missing"),
    ("tiny-qwen2-moe", {"shared_expert_intermediate_size": 1000}, "shared_expert_intermediate_size",
     r"\(1000\) must be a multiple of 'moe_intermediate_size' \(256\): 1000 % 256 = 232"),
    ("tiny-qwen2-moe", {"num_experts": "16"}, "num_experts", "must be an integer, got '16'"),
    ("tiny-qwen2-moe", {"mlp_only_layers": [0.5]}, "mlp_only_layers", "must be a list of integers"),
    ("tiny-mixtral", {"num_local_experts": None}, "num_local_experts", "is missing"),
    ("tiny-mixtral", {"num_local_experts": 0}, "num_local_experts", "must be >= 1, got 0"),
    ("tiny-mixtral", {"intermediate_size": 2.5}, "intermediate_size", "must be an integer, got 2.5"),
    ("tiny-mixtral", {"hidden_size": 500}, "num_attention_heads", r"\(8\) does not divide hidden_size \(500\)"),
])
def test_hostile_configs_name_file_and_key(tmp_path, preset, edit, key, problem):
    cfg = preset_config(preset)
    for k, v in edit.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=rf"{path}: key '{key}' {problem}"):
        load_model(path)


def test_cli_exit_2_on_a_bad_mixtral_config(tmp_path, capsys):
    from reshardctl.cli import main

    cfg = preset_config("tiny-mixtral")
    cfg["num_experts_per_tok"] = 9
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["model", "show", str(tmp_path / "config.json")]) == 2
    err = capsys.readouterr().err
    assert "'num_experts_per_tok' (9) must be between 1 and 'num_local_experts' (8)" in err and "Traceback" not in err


def _qwen2_moe_formula(H, L, nh, nkv, V, I, E, Im, S, moe):
    hd = H // nh
    attn = 2 * nh * hd * H + 2 * nkv * hd * H + (nh + 2 * nkv) * hd  # q, o, k, v weights + q/k/v biases
    dense = 3 * H * I
    sparse = E * H + 3 * E * Im * H + 3 * S * H + H  # router, experts, shared expert, shared-expert gate
    return 2 * V * H + H + sum(attn + 2 * H + (sparse if l in moe else dense) for l in range(L))


@settings(max_examples=40, deadline=None)
@given(L=st.integers(1, 8), step=st.integers(1, 3), only=st.sets(st.integers(0, 7), max_size=3),
       E=st.integers(1, 16), im=st.sampled_from([16, 32]), k=st.integers(1, 4), nkv=st.sampled_from([1, 2, 4]))
def test_qwen2_moe_counts_property(L, step, only, E, im, k, nkv):
    """Any Qwen2-MoE shape: the inventory's parameter count is the closed formula of modeling_qwen2_moe.py."""
    cfg = dict(preset_config("tiny-qwen2-moe"), hidden_size=64, num_attention_heads=4, num_key_value_heads=nkv,
               vocab_size=100, intermediate_size=96, num_hidden_layers=L, decoder_sparse_step=step,
               mlp_only_layers=sorted(only), num_experts=E, num_experts_per_tok=1, moe_intermediate_size=im,
               shared_expert_intermediate_size=k * im)
    m = spec_from_config(cfg, "x")
    moe = {l for l in range(L) if l not in only and (l + 1) % step == 0}
    assert set(m.dims.moe_layers) == moe
    assert m.num_params == _qwen2_moe_formula(64, L, 4, nkv, 100, 96, E, im, k * im, moe)
    assert sum(t.expert is not None for t in m.tensors) == 3 * E * len(moe)


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 6), E=st.integers(1, 12), inter=st.sampled_from([32, 48]), tie=st.booleans())
def test_mixtral_counts_property(L, E, inter, tie):
    cfg = dict(preset_config("tiny-mixtral"), hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=100, num_hidden_layers=L, num_local_experts=E, num_experts_per_tok=1,
               intermediate_size=inter, tie_word_embeddings=tie)
    m = spec_from_config(cfg, "x")
    per_layer = 2 * 64 * 64 + 2 * 32 * 64 + E * 64 + 3 * E * inter * 64 + 2 * 64
    assert m.num_params == (1 if tie else 2) * 100 * 64 + 64 + L * per_layer


@pytest.mark.parametrize("preset", ["tiny-qwen2-moe", "tiny-mixtral"])
def test_safetensors_checkpoint_round_trip(tmp_path, preset):
    """A real sharded checkpoint (headers only read back) gives the config's inventory, biases and shared-expert
    gate included; a checkpoint without one of the biases is refused naming it."""
    from helpers.checkpoints import write_checkpoint
    from reshardctl.models.checkpoint import spec_from_safetensors_index

    config = dict(preset_config(preset), num_hidden_layers=2)
    expected = spec_from_config(config, "ckpt")
    index = write_checkpoint(expected, tmp_path / "ckpt", config=config)
    got = spec_from_safetensors_index(index)
    assert got.tensors == expected.tensors and got.dims == expected.dims
    if preset == "tiny-qwen2-moe":
        from dataclasses import replace

        missing = "model.layers.1.self_attn.v_proj.bias"
        short = replace(expected, tensors=tuple(t for t in expected.tensors if t.name != missing))
        index = write_checkpoint(short, tmp_path / "short", config=config)
        with pytest.raises(ModelError, match=missing.replace(".", r"\.")):
            spec_from_safetensors_index(index)
