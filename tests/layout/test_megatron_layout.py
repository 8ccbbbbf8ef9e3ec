"""Megatron-Core trainer layout: test vectors derived from the Megatron-LM functions (docs/layouts.md),
vocab padding, EP/ETP, pipeline, names."""

from __future__ import annotations

import pytest

from reshardctl.errors import LayoutError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.layout.megatron_params import megatron_qkv_runs
from reshardctl.layout.parallel_spec import parse_parallel as P
from helpers.parallel_models import build_model, deepseek_v3, llama_70b, qwen3_235b, tiny_deepseek, tiny_llama, tiny_qwen3_moe


def qkv_runs_from_params(lay, rank, layer=0):
    """(tensor, hf_row_start, hf_row_end, local_row_start) from local_params' linear_qkv segments."""
    (p,) = [p for p in lay.local_params(rank) if p.name == f"decoder.layers.{layer}.self_attention.linear_qkv.weight"]
    kind = {"q_proj": "q", "k_proj": "k", "v_proj": "v"}
    runs = [(kind[s.hf_name.split(".")[-2]], s.box[0][0], s.box[0][1], s.offset[0]) for s in p.segments]
    return sorted(runs, key=lambda r: r[3]), p


def test_llama70b_tp4_rank1_interleaved_qkv():
    want = [("q", 2048, 3072, 0), ("k", 256, 384, 1024), ("v", 256, 384, 1152),
            ("q", 3072, 4096, 1280), ("k", 384, 512, 2304), ("v", 384, 512, 2432)]
    assert megatron_qkv_runs(64, 8, 128, 4, 1) == want
    lay = MegatronLayout(llama_70b(layers=1), P("tp=4"))
    runs, p = qkv_runs_from_params(lay, 1)
    assert runs == want and p.shape == (2560, 8192)
    m = lay.model
    assert lay.placement(m.index("model.layers.0.self_attn.q_proj.weight")).holding(1) == (
        ((2048, 3072), (0, 8192)), ((3072, 4096), (0, 8192)))


def test_qwen3_235b_tp8_groups_smaller_than_tp():
    lay = MegatronLayout(qwen3_235b(layers=1), P("tp=8"))
    assert qkv_runs_from_params(lay, 0)[0] == [("q", 0, 1152, 0)]
    assert qkv_runs_from_params(lay, 1)[0] == [("q", 1152, 2048, 0), ("k", 0, 128, 896), ("v", 0, 128, 1024)]
    # linear_proj columns: heads [r*8, (r+1)*8)
    o = lay.placement(lay.model.index("model.layers.0.self_attn.o_proj.weight"))
    assert o.holding(3) == (((0, 4096), (3 * 1024, 4 * 1024)),)


@pytest.mark.parametrize("tp,per,last_real", [(4, 38016, 37888), (8, 19072, 18432)])
def test_vocab_padding_qwen3_legacy_divisor(tp, per, last_real):
    """Megatron-LM's vocab_size_with_padding (vocab_divisor=128, its --make-vocab-size-divisible-by default)."""
    lay = MegatronLayout(qwen3_235b(layers=1), P(f"tp={tp},vocab_divisor=128"))
    assert lay.padded_vocab() == per * tp
    for name, pname in (("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
                        ("lm_head.weight", "output_layer.weight")):
        pl = lay.placement(lay.model.index(name))
        ((rows, _cols),) = pl.holding(tp - 1)
        assert rows == ((tp - 1) * per, 151936) and rows[1] - rows[0] == last_real
        assert pl.holding(0) == (((0, per), (0, 4096)),)
        (p,) = [p for p in lay.local_params(tp - 1) if p.name == pname]
        assert p.shape == (per, 4096) and p.segments[0].offset == (0, 0)  # rows past last_real are padding


def test_gated_mlp_stride2_and_dense_tp():
    lay = MegatronLayout(tiny_llama(), P("tp=2,dp=2"))
    (p,) = [p for p in lay.local_params(3) if p.name == "decoder.layers.0.mlp.linear_fc1.weight"]
    segs = {s.hf_name.split(".")[-2]: (s.box, s.offset) for s in p.segments}
    assert p.shape == (128, 64)
    assert segs["gate_proj"] == (((64, 128), (0, 64)), (0, 0))
    assert segs["up_proj"] == (((64, 128), (0, 64)), (64, 0))
    down = lay.placement(lay.model.index("model.layers.0.mlp.down_proj.weight"))
    assert down.holding(1) == down.holding(3) == (((0, 64), (64, 128)),)  # dp replicas identical


def test_experts_ep_blocks_etp_and_local_names():
    m = tiny_qwen3_moe()  # E=8, Im=32
    lay = MegatronLayout(m, P("tp=2,ep=2,etp=1,dp=2,vocab_divisor=128"))  # world 4; expert grid etp=1, ep=2, edp=2
    assert (lay.etp, lay.ep, lay.edp, lay.experts_per_rank) == (1, 2, 2, 4)
    pl = lay.placement(m.index("model.layers.1.mlp.experts.5.up_proj.weight"))
    holders = sorted(r for r, h in pl.items() if h)
    assert holders == [1, 3]  # ep = rank % 2 == 1 (block 1 = experts 4..7), edp replicas
    assert pl.holding(1) == (((0, 32), (0, 64)),)
    names = {p.name: p for p in lay.local_params(1)}
    p = names["decoder.layers.1.mlp.experts.linear_fc1.weight1"]  # global 5 = 1*4 + 1
    assert {s.hf_name: s.offset for s in p.segments} == {
        "model.layers.1.mlp.experts.5.gate_proj.weight": (0, 0), "model.layers.1.mlp.experts.5.up_proj.weight": (32, 0)}
    # bf16 in a bf16 job: built fp32 (moe/router.py), cast by Float16Module (tests/layout/megatron_core/)
    assert names["decoder.layers.1.mlp.router.weight"].dtype == "bfloat16"
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in names
    # ETP splits inside the expert
    lay2 = MegatronLayout(m, P("tp=2,ep=2,dp=2,vocab_divisor=128"))  # etp defaults to tp=2 -> edp=1
    pl = lay2.placement(m.index("model.layers.1.mlp.experts.5.down_proj.weight"))
    assert dict((r, h) for r, h in pl.items() if h) == {2: (((0, 64), (0, 16)),), 3: (((0, 64), (16, 32)),)}


def test_mla_and_mtp_deepseek():
    m = tiny_deepseek(layers=4)
    lay = MegatronLayout(m, P("tp=2,pp=2,ep=2,vocab_divisor=128"))
    L = m.dims.num_layers
    assert lay.stage_of(m.index(f"model.layers.{L}.eh_proj.weight")) == 1  # MTP on the last stage
    qa = lay.placement(m.index("model.layers.0.self_attn.q_a_proj.weight"))
    assert lay.dp == 2 and qa.template.replica_classes() == ((0, 1, 2, 3),)  # replicated (TE spec)
    qb = lay.placement(m.index("model.layers.0.self_attn.q_b_proj.weight"))
    assert qb.holding(1) == (((96, 192), (0, 128)),)
    col = MegatronLayout(m, P("tp=2,pp=2,ep=2,vocab_divisor=128,mla_down_proj=column"))
    assert col.placement(m.index("model.layers.0.self_attn.q_a_proj.weight")).holding(1) == (((64, 128), (0, 256)),)
    names = {p.name for p in lay.local_params(lay.stage_size)}
    assert "mtp.layers.0.eh_proj.weight" in names
    assert "mtp.layers.0.mtp_model_layer.self_attention.linear_kv_up_proj.weight" in names
    assert "output_layer.weight" in names and "decoder.final_layernorm.weight" in names
    assert "decoder.layers.0.input_layernorm.weight" in names  # stage 1's first local layer


def test_tied_embeddings_two_holders():
    m = tiny_llama(tie=True)
    lay = MegatronLayout(m, P("tp=2,pp=2"))
    pl = lay.placement(m.index("model.embed_tokens.weight"))
    assert pl.ranks == (0, 1, 2, 3) and pl.holding(0) == pl.holding(2)
    assert [p.name for p in lay.local_params(2) if "output_layer" in p.name] == ["output_layer.weight"]
    assert MegatronLayout(m, P("tp=2")).placement(m.index("model.embed_tokens.weight")).ranks == (0, 1)


def test_pipeline_even_overrides_and_vpp():
    m = tiny_llama(layers=32)
    lay = MegatronLayout(m, P("pp=4,vpp=2"))
    assert lay.chunks[0][0] == [0, 1, 2, 3] and lay.chunks[0][1] == [16, 17, 18, 19]
    assert lay.chunks[3][1] == [28, 29, 30, 31]
    assert lay.layer_position(17) == (0, 1, 1) and lay.layer_position(28) == (3, 1, 0)
    assert lay.stage_of(m.index("model.layers.29.mlp.up_proj.weight")) == 3
    names = {p.name for p in lay.local_params(0)}
    assert "model1.decoder.layers.1.self_attention.linear_qkv.weight" in names  # global layer 17
    assert "model0.embedding.word_embeddings.weight" in names
    lay = MegatronLayout(tiny_llama(layers=10), P("pp=4,first=1,last=3"))
    assert [lay.layer_position(g)[0] for g in range(10)] == [0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert lay.stage_ranks(2) == (2,) and lay.num_stages() == 4


def test_rank_order_tp_cp_dp_pp():
    lay = MegatronLayout(tiny_qwen3_moe(), P("tp=2,cp=2,dp=2,pp=2,ep=4,etp=1,vocab_divisor=128"))
    assert lay.world_size == 16 and lay.edp == 2
    assert lay.coords(13) == {"pp": 1, "tp": 1, "cp": 0, "dp": 1, "etp": 0, "ep": 1, "edp": 1}
    assert lay.stage_ranks(1) == tuple(range(8, 16))


def test_validation_lists_every_violation_with_arithmetic():
    with pytest.raises(LayoutError) as ei:
        MegatronLayout(qwen3_235b(layers=94), P("tp=3,pp=3,ep=6"))
    v = ei.value.violations
    s = "\n".join(v)
    assert "tp=3 does not divide num_attention_heads=64 (64/3 = 21.33)" in s
    assert "Megatron ep=6 does not divide num_experts=128" in s
    assert "pp=3 does not divide 94 layers" in s and "first_stage_layers/last_stage_layers" in s
    assert "tp=3 does not divide the unpadded vocab_size=151936 (151936/3 = 50645.33" in s
    assert len(v) == 4
    with pytest.raises(LayoutError, match="12 were given"):
        MegatronLayout(tiny_llama(), P("tp=2,dp=2,pp=2"), world_size=12)
    odd = build_model("odd", arch="llama", H=96, L=2, nh=12, nkv=4, hd=8, V=500, I=192)
    with pytest.raises(LayoutError, match=r"num_query_groups=4: one must divide the other \(4 % 6 = 4, 6 % 4 = 2\)"):
        MegatronLayout(odd, P("tp=6"))


def test_deepseek_v3_full_scale_placements():
    m = deepseek_v3()
    lay = MegatronLayout(m, P("tp=1,pp=16,ep=16,dp=16,first=3,last=2"))
    assert lay.world_size == 256 and lay.experts_per_rank == 16
    for i in range(len(m.tensors)):
        lay.placement(i)
    assert len(lay._templates) < 200  # interned
    e = m.index("model.layers.40.mlp.experts.37.gate_proj.weight")
    pl = lay.placement(e)
    st = lay.stage_of(e)
    assert [r for r, h in pl.items() if h] == [st * 16 + 2]  # ep block 37 // 16 = 2


def test_vocab_unpadded_by_default_megatron_bridge():
    """Megatron-Bridge (should_pad_vocab=False): V/TP rows per rank, no padding rows."""
    lay = MegatronLayout(qwen3_235b(layers=1), P("tp=4"))
    assert lay.padded_vocab() == 151936 and lay.vocab_divisor is None
    pl = lay.placement(lay.model.index("lm_head.weight"))
    assert [h for _, h in pl.items()] == [(((r * 37984, (r + 1) * 37984), (0, 4096)),) for r in range(4)]
    (p,) = [p for p in lay.local_params(3) if p.name == "output_layer.weight"]
    assert p.shape == (37984, 4096)
    # DeepSeek-V3's Bridge recipe divisor 1280: 129280 -> ceil(129280/(1280*8))*1280*8 = 133120 at tp=8
    ds = MegatronLayout(deepseek_v3(layers=1, mtp=0), P("tp=8,vocab_divisor=1280"))
    assert ds.padded_vocab() == 133120
    assert "vocab_divisor=1280" in ds.describe() and "vocab_divisor=none" in lay.describe()
