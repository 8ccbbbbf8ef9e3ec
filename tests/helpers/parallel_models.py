"""Local ModelSpec builders from the HF shapes of each architecture (config.json + its modeling file, as in
reshardctl/models/architectures.py) for the layout tests; independent of the model catalog.
"""

from __future__ import annotations

from dataclasses import replace
from math import ceil

from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec


def build_model(name: str, *, arch: str, H: int, L: int, nh: int, nkv: int, hd: int, V: int, I: int,
                E: int = 0, Im: int = 0, shared: int = 0, first_dense: int = 0, tie: bool = False,
                mla: dict | None = None, mtp: int = 0, fp8: bool = False) -> ModelSpec:
    ts: list[TensorSpec] = []
    bf = "bfloat16"

    def add(n, shape, role, kind, layer=None, expert=None, dtype=bf, scaled=False):
        dt = "float8_e4m3fn" if (scaled and fp8) else dtype
        ts.append(TensorSpec(n, tuple(shape), dt, role, kind, layer, expert))
        if scaled and fp8:
            sshape = tuple(ceil(s / 128) for s in shape)
            ts.append(TensorSpec(n + "_scale_inv", sshape, "float32", "scale", "scale_inv", layer, expert, n))

    moe_layers = tuple(range(first_dense, L + mtp)) if E else ()
    add("model.embed_tokens.weight", (V, H), "embedding", "embed")
    for l in range(L + mtp):
        p = f"model.layers.{l}."
        if l >= L:
            add(p + "enorm.weight", (H,), "norm", "mtp_enorm", l)
            add(p + "hnorm.weight", (H,), "norm", "mtp_hnorm", l)
            add(p + "eh_proj.weight", (H, 2 * H), "ffn", "mtp_eh_proj", l)
            add(p + "embed_tokens.weight", (V, H), "embedding", "embed", l)
            add(p + "shared_head.norm.weight", (H,), "norm", "mtp_head_norm", l)
            add(p + "shared_head.head.weight", (V, H), "head", "lm_head", l)
        add(p + "input_layernorm.weight", (H,), "norm", "input_norm", l)
        a = p + "self_attn."
        if mla:
            qr, kr, nope, rope, vd = mla["q_lora"], mla["kv_lora"], mla["nope"], mla["rope"], mla["v"]
            if qr:
                add(a + "q_a_proj.weight", (qr, H), "attention", "q_a", l, scaled=True)
                add(a + "q_a_layernorm.weight", (qr,), "norm", "q_a_norm", l)
                add(a + "q_b_proj.weight", (nh * (nope + rope), qr), "attention", "q_b", l, scaled=True)
            else:  # q_lora_rank null (DeepSeek-V2-Lite): one q_proj
                add(a + "q_proj.weight", (nh * (nope + rope), H), "attention", "q", l, scaled=True)
            add(a + "kv_a_proj_with_mqa.weight", (kr + rope, H), "attention", "kv_a", l, scaled=True)
            add(a + "kv_a_layernorm.weight", (kr,), "norm", "kv_a_norm", l)
            add(a + "kv_b_proj.weight", (nh * (nope + vd), kr), "attention", "kv_b", l, scaled=True)
            add(a + "o_proj.weight", (H, nh * vd), "attention", "o", l, scaled=True)
        else:
            add(a + "q_proj.weight", (nh * hd, H), "attention", "q", l)
            add(a + "k_proj.weight", (nkv * hd, H), "attention", "k", l)
            add(a + "v_proj.weight", (nkv * hd, H), "attention", "v", l)
            add(a + "o_proj.weight", (H, nh * hd), "attention", "o", l)
            if arch.startswith("qwen3"):
                add(a + "q_norm.weight", (hd,), "norm", "q_norm", l)
                add(a + "k_norm.weight", (hd,), "norm", "k_norm", l)
        add(p + "post_attention_layernorm.weight", (H,), "norm", "post_attn_norm", l)
        m = p + "mlp."
        if l in moe_layers:
            add(m + "gate.weight", (E, H), "router", "router", l)
            if arch == "deepseek_v3":
                add(m + "gate.e_score_correction_bias", (E,), "router", "router_bias", l, dtype="float32")
            for e in range(E):
                x = f"{m}experts.{e}."
                add(x + "gate_proj.weight", (Im, H), "expert", "expert_gate", l, e, scaled=True)
                add(x + "up_proj.weight", (Im, H), "expert", "expert_up", l, e, scaled=True)
                add(x + "down_proj.weight", (H, Im), "expert", "expert_down", l, e, scaled=True)
            if shared:
                add(m + "shared_experts.gate_proj.weight", (Im * shared, H), "ffn", "shared_gate", l, scaled=True)
                add(m + "shared_experts.up_proj.weight", (Im * shared, H), "ffn", "shared_up", l, scaled=True)
                add(m + "shared_experts.down_proj.weight", (H, Im * shared), "ffn", "shared_down", l, scaled=True)
        else:
            add(m + "gate_proj.weight", (I, H), "ffn", "mlp_gate", l, scaled=True)
            add(m + "up_proj.weight", (I, H), "ffn", "mlp_up", l, scaled=True)
            add(m + "down_proj.weight", (H, I), "ffn", "mlp_down", l, scaled=True)
    add("model.norm.weight", (H,), "norm", "final_norm")
    if not tie:
        add("lm_head.weight", (V, H), "head", "lm_head")
    m = mla or {}
    dims = ModelDims(arch=arch, hidden=H, num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=hd, vocab=V,
                     intermediate=I, tie_embeddings=tie, num_experts=E, moe_intermediate=Im,
                     num_shared_experts=shared, moe_layers=moe_layers, num_mtp_layers=mtp,
                     q_lora_rank=m.get("q_lora", 0), kv_lora_rank=m.get("kv_lora", 0),
                     qk_nope_head_dim=m.get("nope", 0), qk_rope_head_dim=m.get("rope", 0),
                     v_head_dim=m.get("v", 0))
    return ModelSpec(name, dims, tuple(ts), source="test")


DSV3_MLA = dict(q_lora=1536, kv_lora=512, nope=128, rope=64, v=128)


def llama_70b(layers: int = 80) -> ModelSpec:
    return build_model("llama-3.1-70b", arch="llama", H=8192, L=layers, nh=64, nkv=8, hd=128, V=128256, I=28672)


def llama_8b(layers: int = 32) -> ModelSpec:
    return build_model("llama-3.1-8b", arch="llama", H=4096, L=layers, nh=32, nkv=8, hd=128, V=128256, I=14336)


def qwen3_235b(layers: int = 94) -> ModelSpec:
    return build_model("qwen3-235b-a22b", arch="qwen3_moe", H=4096, L=layers, nh=64, nkv=4, hd=128, V=151936,
                       I=12288, E=128, Im=1536)


def qwen3_30b(layers: int = 48) -> ModelSpec:
    return build_model("qwen3-30b-a3b", arch="qwen3_moe", H=2048, L=layers, nh=32, nkv=4, hd=128, V=151936,
                       I=6144, E=128, Im=768)


def deepseek_v3(layers: int = 61, mtp: int = 1) -> ModelSpec:
    return build_model("deepseek-v3", arch="deepseek_v3", H=7168, L=layers, nh=128, nkv=128, hd=192, V=129280,
                       I=18432, E=256, Im=2048, shared=1, first_dense=min(3, layers), mla=DSV3_MLA, mtp=mtp,
                       fp8=True)


def tiny_llama(layers: int = 4, tie: bool = False) -> ModelSpec:
    return build_model("tiny-llama", arch="llama", H=64, L=layers, nh=8, nkv=4, hd=8, V=1000, I=128, tie=tie)


def tiny_qwen3_moe(layers: int = 4) -> ModelSpec:
    return build_model("tiny-qwen3-moe", arch="qwen3_moe", H=64, L=layers, nh=8, nkv=2, hd=16, V=1003, I=128,
                       E=8, Im=32)


def tiny_deepseek(layers: int = 3, fp8: bool = True, q_lora: int = 128) -> ModelSpec:
    return build_model("tiny-deepseek", arch="deepseek_v3", H=256, L=layers, nh=8, nkv=8, hd=24, V=1111, I=512,
                       E=8, Im=128, shared=1, first_dense=1,
                       mla=dict(q_lora=q_lora, kv_lora=64, nope=16, rope=8, v=16), mtp=1, fp8=fp8)


def tiny_qwen3(layers: int = 2) -> ModelSpec:
    """Dense qwen3 (q/k norms) with one KV head: Megatron tp=2 > num_query_groups=1."""
    return build_model("tiny-qwen3", arch="qwen3", H=64, L=layers, nh=4, nkv=1, hd=16, V=1000, I=128)


# --------------------------------------------------------------------------- vLLM binding models (engineer "vllm")
def tiny_deepseek_v2_lite(layers: int = 3) -> ModelSpec:
    """A DeepSeek-V2-Lite-like MLA model without q_lora (``q_proj`` + ``kv_a_proj_with_mqa``; HF modeling:
    ``q_lora_rank: null``), shared experts, MTP; bf16."""
    m = build_model("tiny-deepseek-v2-lite", arch="deepseek_v3", H=256, L=layers, nh=8, nkv=8, hd=24, V=1111,
                    I=512, E=8, Im=128, shared=2, first_dense=1,
                    mla=dict(q_lora=64, kv_lora=64, nope=16, rope=8, v=16), mtp=1)
    out: list[TensorSpec] = []
    for t in m.tensors:
        if t.kind in ("q_a", "q_a_norm"):
            continue
        if t.kind == "q_b":
            t = TensorSpec(t.name.replace("q_b_proj", "q_proj"), (t.shape[0], 256), t.dtype, t.role, "q", t.layer)
        out.append(t)
    return ModelSpec(m.name, replace(m.dims, q_lora_rank=0), tuple(out), source="test")


def tiny_deepseek_grouped(layers: int = 3) -> ModelSpec:
    """tiny_deepseek (bf16) with grouped routing (``n_group: 2``), which vLLM's round_robin placement needs."""
    m = tiny_deepseek(layers, fp8=False)
    return replace(m, config={"n_group": 2, "topk_group": 1})


# --------------------------------------------------------------------------- engineer "archs1": Qwen2, Qwen2-MoE, Mixtral
# The HF checkpoint names and shapes of transformers' modeling_qwen2.py (q/k/v_proj bias, o_proj none),
# modeling_qwen2_moe.py (mlp.gate, mlp.experts.{e}, mlp.shared_expert (singular) and mlp.shared_expert_gate [1, H])
# and modeling_mixtral.py (block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1 gate / w2 down / w3 up), written
# as edits of build_model's llama / qwen3_moe / deepseek tensors (independent of reshardctl.models).
def _with_qkv_bias(ts: list[TensorSpec]) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for t in ts:
        out.append(t)
        for p in ("q", "k", "v"):
            if t.name.endswith(f".self_attn.{p}_proj.weight"):
                out.append(TensorSpec(t.name[:-len("weight")] + "bias", t.shape[:1], t.dtype, "attention",
                                      f"{p}_bias", t.layer))
    return out


def tiny_qwen2(layers: int = 4, tie: bool = False) -> ModelSpec:
    """Qwen2 dense: llama shapes with q/k/v biases; nkv=2 (tp 4 and 8 replicate kv heads)."""
    m = build_model("tiny-qwen2", arch="qwen2", H=64, L=layers, nh=8, nkv=2, hd=8, V=1000, I=128, tie=tie)
    return replace(m, tensors=tuple(_with_qkv_bias(list(m.tensors))))


def tiny_qwen2_moe(layers: int = 4) -> ModelSpec:
    """Qwen2-MoE: layer 0 dense (mlp_only_layers [0]), 8 experts of 32, one shared expert of 64 (= 2 x 32, held as
    num_shared_experts 2), the shared-expert gate, q/k/v biases."""
    m = build_model("tiny-qwen2-moe", arch="qwen2_moe", H=64, L=layers, nh=8, nkv=2, hd=8, V=1003, I=128,
                    E=8, Im=32, shared=2, first_dense=1)
    out: list[TensorSpec] = []
    for t in _with_qkv_bias(list(m.tensors)):
        if ".shared_experts." in t.name:
            t = replace(t, name=t.name.replace(".shared_experts.", ".shared_expert."))
        out.append(t)
        if t.name.endswith(".mlp.shared_expert.down_proj.weight"):
            out.append(TensorSpec(t.name.replace("shared_expert.down_proj", "shared_expert_gate"), (1, 64), t.dtype,
                                  "ffn", "shared_expert_gate", t.layer))
    return replace(m, tensors=tuple(out))


def tiny_mixtral(layers: int = 4) -> ModelSpec:
    """Mixtral: every layer MoE, 8 experts of 64 under block_sparse_moe (w1 gate, w3 up, w2 down), no dense MLP."""
    m = build_model("tiny-mixtral", arch="mixtral", H=64, L=layers, nh=8, nkv=2, hd=8, V=1000, I=0, E=8, Im=64)
    names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    out: list[TensorSpec] = []
    for t in m.tensors:
        n = t.name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        if t.expert is not None:
            head, proj, tail = n.rsplit(".", 2)
            n = f"{head.replace('.mlp.experts.', '.block_sparse_moe.experts.')}.{names[proj]}.{tail}"
        out.append(replace(t, name=n))
    return replace(m, tensors=tuple(out))


# --------------------------------------------------------------------------- GLM-4.5 MoE, gpt-oss (engineer "archs2")
def glm4_moe_model(name: str = "tiny-glm", *, H: int = 256, L: int = 3, nh: int = 8, nkv: int = 2, hd: int = 32,
                   V: int = 1000, I: int = 512, E: int = 8, Im: int = 128, shared: int = 1, first_dense: int = 1,
                   qk_norm: bool = True, mtp: int = 0) -> ModelSpec:
    """GLM-4.5 MoE from transformers ``modeling_glm4_moe.py`` (``Glm4MoeAttention``: q/k/v ``bias=attention_bias``,
    o_proj no bias, ``q_norm``/``k_norm`` RMSNorm(head_dim) when ``use_qk_norm``; ``Glm4MoeMoE``: ``gate.weight``
    [E, H] + fp32 ``gate.e_score_correction_bias`` buffer, ``experts.{e}``, ``shared_experts`` of width
    ``Im * n_shared``; layers ``< first_k_dense_replace`` dense) and the checkpoint's MTP layers
    (``model.layers.{L+k}``: embed_tokens, enorm, hnorm, eh_proj [H, 2H], the decoder layer, shared_head)."""
    ts: list[TensorSpec] = []
    bf = "bfloat16"

    def add(n, shape, role, kind, layer=None, expert=None, dtype=bf):
        ts.append(TensorSpec(n, tuple(shape), dtype, role, kind, layer, expert))

    def layer(l: int) -> None:
        p = f"model.layers.{l}."
        a = p + "self_attn."
        add(p + "input_layernorm.weight", (H,), "norm", "input_norm", l)
        for proj, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            add(f"{a}{proj}_proj.weight", (rows, H), "attention", proj, l)
            add(f"{a}{proj}_proj.bias", (rows,), "attention", f"{proj}_bias", l)
        add(a + "o_proj.weight", (H, nh * hd), "attention", "o", l)
        if qk_norm:
            add(a + "q_norm.weight", (hd,), "norm", "q_norm", l)
            add(a + "k_norm.weight", (hd,), "norm", "k_norm", l)
        add(p + "post_attention_layernorm.weight", (H,), "norm", "post_attn_norm", l)
        m = p + "mlp."
        if l < first_dense:
            for proj, kind, shape in (("gate", "mlp_gate", (I, H)), ("up", "mlp_up", (I, H)),
                                      ("down", "mlp_down", (H, I))):
                add(f"{m}{proj}_proj.weight", shape, "ffn", kind, l)
            return
        add(m + "gate.weight", (E, H), "router", "router", l)
        add(m + "gate.e_score_correction_bias", (E,), "router", "router_bias", l, dtype="float32")
        for e in range(E):
            x = f"{m}experts.{e}."
            add(x + "gate_proj.weight", (Im, H), "expert", "expert_gate", l, e)
            add(x + "up_proj.weight", (Im, H), "expert", "expert_up", l, e)
            add(x + "down_proj.weight", (H, Im), "expert", "expert_down", l, e)
        S = Im * shared
        add(m + "shared_experts.gate_proj.weight", (S, H), "ffn", "shared_gate", l)
        add(m + "shared_experts.up_proj.weight", (S, H), "ffn", "shared_up", l)
        add(m + "shared_experts.down_proj.weight", (H, S), "ffn", "shared_down", l)

    add("model.embed_tokens.weight", (V, H), "embedding", "embed")
    for l in range(L):
        layer(l)
    add("model.norm.weight", (H,), "norm", "final_norm")
    add("lm_head.weight", (V, H), "head", "lm_head")
    for l in range(L, L + mtp):
        p = f"model.layers.{l}."
        add(p + "embed_tokens.weight", (V, H), "embedding", "embed", l)
        add(p + "enorm.weight", (H,), "norm", "mtp_enorm", l)
        add(p + "hnorm.weight", (H,), "norm", "mtp_hnorm", l)
        add(p + "eh_proj.weight", (H, 2 * H), "ffn", "mtp_eh_proj", l)
        layer(l)
        add(p + "shared_head.norm.weight", (H,), "norm", "mtp_head_norm", l)
        add(p + "shared_head.head.weight", (V, H), "head", "lm_head", l)
    dims = ModelDims(arch="glm4_moe", hidden=H, num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=hd, vocab=V,
                     intermediate=I, num_experts=E, moe_intermediate=Im, num_shared_experts=shared,
                     moe_layers=tuple(range(first_dense, L + mtp)), num_mtp_layers=mtp, qk_norm=qk_norm)
    return ModelSpec(name, dims, tuple(ts), source="test")


def gpt_oss_model(name: str = "tiny-gpt-oss", *, H: int = 256, L: int = 2, nh: int = 8, nkv: int = 2, hd: int = 32,
                  V: int = 1000, E: int = 8, Im: int = 128) -> ModelSpec:
    """gpt-oss (BF16 form) from transformers ``modeling_gpt_oss.py``: ``GptOssAttention`` q/k/v/o with bias and
    ``sinks`` [num_heads]; ``GptOssTopKRouter`` ``weight`` [E, H] + ``bias`` [E]; ``GptOssExperts``
    ``gate_up_proj`` [E, H, 2*I], ``gate_up_proj_bias`` [E, 2*I], ``down_proj`` [E, I, H], ``down_proj_bias``
    [E, H] (``intermediate_size`` = I); every layer MoE, no shared experts, untied lm_head."""
    ts: list[TensorSpec] = []
    bf = "bfloat16"

    def add(n, shape, role, kind, layer=None):
        ts.append(TensorSpec(n, tuple(shape), bf, role, kind, layer))

    add("model.embed_tokens.weight", (V, H), "embedding", "embed")
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        add(p + "input_layernorm.weight", (H,), "norm", "input_norm", l)
        for proj, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
            add(f"{a}{proj}_proj.weight", (rows, H), "attention", proj, l)
            add(f"{a}{proj}_proj.bias", (rows,), "attention", f"{proj}_bias", l)
        add(a + "o_proj.weight", (H, nh * hd), "attention", "o", l)
        add(a + "o_proj.bias", (H,), "attention", "o_bias", l)
        add(a + "sinks", (nh,), "attention", "sinks", l)
        add(p + "post_attention_layernorm.weight", (H,), "norm", "post_attn_norm", l)
        m = p + "mlp."
        add(m + "router.weight", (E, H), "router", "router", l)
        add(m + "router.bias", (E,), "router", "router_linear_bias", l)
        add(m + "experts.gate_up_proj", (E, H, 2 * Im), "expert", "stacked_gate_up", l)
        add(m + "experts.gate_up_proj_bias", (E, 2 * Im), "expert", "stacked_gate_up_bias", l)
        add(m + "experts.down_proj", (E, Im, H), "expert", "stacked_down", l)
        add(m + "experts.down_proj_bias", (E, H), "expert", "stacked_down_bias", l)
    add("model.norm.weight", (H,), "norm", "final_norm")
    add("lm_head.weight", (V, H), "head", "lm_head")
    dims = ModelDims(arch="gpt_oss", hidden=H, num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=hd, vocab=V,
                     intermediate=Im, num_experts=E, moe_intermediate=Im, moe_layers=tuple(range(L)))
    return ModelSpec(name, dims, tuple(ts), source="test")
