"""What each supported architecture's checkpoint holds, as tables.

A decoder layer is a sequence of *blocks*; a block is a tuple of ``(name suffix, kind, shape, dtype)``
rows. Shapes are written with symbols (``"H"``, ``"Q"``, ...) that :func:`symbols` resolves from the
architecture numbers, so every architecture is a few lines of table, not code. ``dtype`` ``None``
means the model dtype (``torch_dtype``).

Symbols: H hidden, V vocab, hd head_dim, Q nh*hd, KV nkv*hd, I intermediate, Im moe_intermediate,
E routed experts, S shared-expert width (Im*n_shared; Qwen2-MoE: shared_expert_intermediate_size), H2 2*H, 1 one,
NH num_heads, Im2 2*Im; MLA: QL q_lora_rank,
QH nh*(nope+rope), KVA kv_lora+rope, KVL kv_lora_rank, KVB nh*(nope+v), OV nh*v.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from reshardctl.models.spec import ModelDims

Row = tuple[str, str, tuple[str, ...], "str | None"]
Block = tuple[Row, ...]

# kind -> role (ROLES in spec.py). MTP's eh_proj is a dense linear: "ffn".
KIND_ROLE: dict[str, str] = {
    "embed": "embedding",
    "lm_head": "head",
    **dict.fromkeys(
        ("final_norm", "input_norm", "post_attn_norm", "q_norm", "k_norm", "q_a_norm", "kv_a_norm",
         "mtp_enorm", "mtp_hnorm", "mtp_head_norm"),
        "norm",
    ),
    **dict.fromkeys(("q", "k", "v", "o", "q_a", "q_b", "kv_a", "kv_b"), "attention"),
    **dict.fromkeys(("mlp_gate", "mlp_up", "mlp_down", "shared_gate", "shared_up", "shared_down",
                     "mtp_eh_proj"), "ffn"),
    "router": "router",
    "router_bias": "router",
    **dict.fromkeys(("expert_gate", "expert_up", "expert_down"), "expert"),
    "scale_inv": "scale",
    # engineer "archs1": Qwen2 / Qwen2-MoE attention biases, Qwen2-MoE's sigmoid gate of the shared expert;
    # archs2 (GLM-4.5 MoE, gpt-oss): attention biases, gpt-oss sinks / router bias / stacked experts
    **dict.fromkeys(("q_bias", "k_bias", "v_bias", "o_bias", "sinks"), "attention"),
    "shared_expert_gate": "ffn",
    "router_linear_bias": "router",
    **dict.fromkeys(("stacked_gate_up", "stacked_gate_up_bias", "stacked_down", "stacked_down_bias"), "expert"),
}

# routed-expert weight kinds (one 2-D tensor per expert); the attention biases and the weight whose rows they follow
EXPERT_KINDS = frozenset({"expert_gate", "expert_up", "expert_down"})
QKV_BIAS_KINDS = {"q_bias": "q", "k_bias": "k", "v_bias": "v"}

# Linear weights stored as fp8 (with a fp32 ``weight_scale_inv``) in block-fp8 checkpoints
# (DeepSeek-V3 and Qwen3 "-FP8"). Embeddings, lm_head, norms, the router and eh_proj stay bf16.
FP8_KINDS = frozenset(
    ("q", "k", "v", "o", "q_a", "q_b", "kv_a", "kv_b", "mlp_gate", "mlp_up", "mlp_down",
     "shared_gate", "shared_up", "shared_down", "expert_gate", "expert_up", "expert_down")
)

# ---- blocks (the fixed order inside a layer) -----------------------------------------------------
INPUT_NORM: Block = (("input_layernorm.weight", "input_norm", ("H",), None),)
POST_NORM: Block = (("post_attention_layernorm.weight", "post_attn_norm", ("H",), None),)
GQA: Block = (
    ("self_attn.q_proj.weight", "q", ("Q", "H"), None),
    ("self_attn.k_proj.weight", "k", ("KV", "H"), None),
    ("self_attn.v_proj.weight", "v", ("KV", "H"), None),
    ("self_attn.o_proj.weight", "o", ("H", "Q"), None),
)
QK_NORM: Block = (
    ("self_attn.q_norm.weight", "q_norm", ("hd",), None),
    ("self_attn.k_norm.weight", "k_norm", ("hd",), None),
)
MLA_Q_LORA: Block = (
    ("self_attn.q_a_proj.weight", "q_a", ("QL", "H"), None),
    ("self_attn.q_a_layernorm.weight", "q_a_norm", ("QL",), None),
    ("self_attn.q_b_proj.weight", "q_b", ("QH", "QL"), None),
)
MLA_Q_DIRECT: Block = (("self_attn.q_proj.weight", "q", ("QH", "H"), None),)  # q_lora_rank null
MLA_KV: Block = (
    ("self_attn.kv_a_proj_with_mqa.weight", "kv_a", ("KVA", "H"), None),
    ("self_attn.kv_a_layernorm.weight", "kv_a_norm", ("KVL",), None),
    ("self_attn.kv_b_proj.weight", "kv_b", ("KVB", "KVL"), None),
    ("self_attn.o_proj.weight", "o", ("H", "OV"), None),
)
DENSE_MLP: Block = (
    ("mlp.gate_proj.weight", "mlp_gate", ("I", "H"), None),
    ("mlp.up_proj.weight", "mlp_up", ("I", "H"), None),
    ("mlp.down_proj.weight", "mlp_down", ("H", "I"), None),
)
ROUTER: Block = (("mlp.gate.weight", "router", ("E", "H"), None),)
ROUTER_BIAS: Block = (("mlp.gate.e_score_correction_bias", "router_bias", ("E",), "float32"),)
EXPERT: Block = (  # repeated for e in range(E); "{e}" is filled in
    ("mlp.experts.{e}.gate_proj.weight", "expert_gate", ("Im", "H"), None),
    ("mlp.experts.{e}.up_proj.weight", "expert_up", ("Im", "H"), None),
    ("mlp.experts.{e}.down_proj.weight", "expert_down", ("H", "Im"), None),
)
SHARED: Block = (
    ("mlp.shared_experts.gate_proj.weight", "shared_gate", ("S", "H"), None),
    ("mlp.shared_experts.up_proj.weight", "shared_up", ("S", "H"), None),
    ("mlp.shared_experts.down_proj.weight", "shared_down", ("H", "S"), None),
)
# DeepSeek MTP layer: these around a full decoder layer (same prefix model.layers.{L+i}.)
MTP_BEFORE: Block = (
    ("embed_tokens.weight", "embed", ("V", "H"), None),
    ("enorm.weight", "mtp_enorm", ("H",), None),
    ("hnorm.weight", "mtp_hnorm", ("H",), None),
    ("eh_proj.weight", "mtp_eh_proj", ("H", "H2"), None),
)
MTP_AFTER: Block = (
    ("shared_head.norm.weight", "mtp_head_norm", ("H",), None),
    ("shared_head.head.weight", "lm_head", ("V", "H"), None),
)
EMBED: Row = ("model.embed_tokens.weight", "embed", ("V", "H"), None)
FINAL_NORM: Row = ("model.norm.weight", "final_norm", ("H",), None)
LM_HEAD: Row = ("lm_head.weight", "lm_head", ("V", "H"), None)

# ---- engineer "archs1": Qwen2 / Qwen2.5, Qwen2-MoE, Mixtral (transformers models/qwen2/modeling_qwen2.py
# Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False; models/qwen2_moe/modeling_qwen2_moe.py
# Qwen2MoeSparseMoeBlock: gate, experts.{e}, shared_expert (singular, shared_expert_intermediate_size wide),
# shared_expert_gate Linear(H, 1, bias=False); models/mixtral/modeling_mixtral.py MixtralSparseMoeBlock:
# block_sparse_moe.gate, experts.{e}.w1 (gate) / w2 (down) / w3 (up))
GQA_BIAS: Block = (
    ("self_attn.q_proj.weight", "q", ("Q", "H"), None),
    ("self_attn.q_proj.bias", "q_bias", ("Q",), None),
    ("self_attn.k_proj.weight", "k", ("KV", "H"), None),
    ("self_attn.k_proj.bias", "k_bias", ("KV",), None),
    ("self_attn.v_proj.weight", "v", ("KV", "H"), None),
    ("self_attn.v_proj.bias", "v_bias", ("KV",), None),
    ("self_attn.o_proj.weight", "o", ("H", "Q"), None),
)
SHARED_EXPERT: Block = (  # Qwen2-MoE: one shared expert of width S = shared_expert_intermediate_size
    ("mlp.shared_expert.gate_proj.weight", "shared_gate", ("S", "H"), None),
    ("mlp.shared_expert.up_proj.weight", "shared_up", ("S", "H"), None),
    ("mlp.shared_expert.down_proj.weight", "shared_down", ("H", "S"), None),
)
SHARED_EXPERT_GATE: Block = (("mlp.shared_expert_gate.weight", "shared_expert_gate", ("1", "H"), None),)
MIXTRAL_ROUTER: Block = (("block_sparse_moe.gate.weight", "router", ("E", "H"), None),)
MIXTRAL_EXPERT: Block = (  # repeated for e in range(E), like EXPERT
    ("block_sparse_moe.experts.{e}.w1.weight", "expert_gate", ("Im", "H"), None),
    ("block_sparse_moe.experts.{e}.w2.weight", "expert_down", ("H", "Im"), None),
    ("block_sparse_moe.experts.{e}.w3.weight", "expert_up", ("Im", "H"), None),
)


def is_expert_block(block: Block) -> bool:
    """A block repeated once per routed expert (its names hold ``{e}``)."""
    return "{e}" in block[0][0]


# ---- archs2: GLM-4.5 MoE (transformers modeling_glm4_moe.py) and gpt-oss (modeling_gpt_oss.py) ----------
QKV_BIAS: Block = (  # GLM-4.5 attention_bias=true: q/k/v biases, no o_proj bias (Glm4MoeAttention)
    ("self_attn.q_proj.bias", "q_bias", ("Q",), None),
    ("self_attn.k_proj.bias", "k_bias", ("KV",), None),
    ("self_attn.v_proj.bias", "v_bias", ("KV",), None),
)
GPT_OSS_ATTN: Block = (  # GptOssAttention: q/k/v/o with bias, learned sinks [num_heads]
    *GQA_BIAS,
    ("self_attn.o_proj.bias", "o_bias", ("H",), None),
    ("self_attn.sinks", "sinks", ("NH",), None),
)
GPT_OSS_MOE: Block = (  # GptOssTopKRouter (weight + bias) and GptOssExperts: all experts in one tensor each,
    # gate_up_proj [E, H, 2*Im] with gate/up INTERLEAVED on the last dim (gate = [..., ::2], up = [..., 1::2])
    ("mlp.router.weight", "router", ("E", "H"), None),
    ("mlp.router.bias", "router_linear_bias", ("E",), None),
    ("mlp.experts.gate_up_proj", "stacked_gate_up", ("E", "H", "Im2"), None),
    ("mlp.experts.gate_up_proj_bias", "stacked_gate_up_bias", ("E", "Im2"), None),
    ("mlp.experts.down_proj", "stacked_down", ("E", "Im", "H"), None),
    ("mlp.experts.down_proj_bias", "stacked_down_bias", ("E", "H"), None),
)


@dataclass(frozen=True)
class Arch:
    """One architecture: its ``ModelDims.arch`` name, attention blocks and MoE blocks."""

    key: str
    attention: Callable[[ModelDims], tuple[Block, ...]]
    moe: tuple[Block, ...] = ()  # blocks of a MoE layer's FFN, EXPERT repeated per expert
    mtp: bool = False  # has DeepSeek-style MTP layers (num_nextn_predict_layers)

    def layer_blocks(self, dims: ModelDims, layer: int) -> tuple[Block, ...]:
        ffn = self.moe if layer in dims.moe_layers else (DENSE_MLP,)
        return (INPUT_NORM, *self.attention(dims), POST_NORM, *ffn)


ARCHS: dict[str, Arch] = {
    "llama": Arch("llama", lambda d: (GQA,)),
    "qwen3": Arch("qwen3", lambda d: (GQA, QK_NORM)),
    "qwen3_moe": Arch("qwen3_moe", lambda d: (GQA, QK_NORM), moe=(ROUTER, EXPERT)),
    "deepseek_v3": Arch(
        "deepseek_v3",
        lambda d: (MLA_Q_LORA if d.q_lora_rank else MLA_Q_DIRECT, MLA_KV),
        moe=(ROUTER, ROUTER_BIAS, EXPERT, SHARED),
        mtp=True,
    ),
    # engineer "archs1"
    "qwen2": Arch("qwen2", lambda d: (GQA_BIAS,)),
    "qwen2_moe": Arch("qwen2_moe", lambda d: (GQA_BIAS,), moe=(ROUTER, EXPERT, SHARED_EXPERT, SHARED_EXPERT_GATE)),
    "mixtral": Arch("mixtral", lambda d: (GQA,), moe=(MIXTRAL_ROUTER, MIXTRAL_EXPERT)),
    # archs2: GLM-4.5 (DeepSeek-V3's MoE, router bias and MTP layers with GQA attention + q/k/v bias, optional qk-norm)
    "glm4_moe": Arch(
        "glm4_moe",
        lambda d: (GQA, QKV_BIAS, QK_NORM) if d.qk_norm else (GQA, QKV_BIAS),
        moe=(ROUTER, ROUTER_BIAS, EXPERT, SHARED),
        mtp=True,
    ),
    # archs2: gpt-oss (every layer MoE; BF16 form of the experts, MXFP4 refused in config.py)
    "gpt_oss": Arch("gpt_oss", lambda d: (GPT_OSS_ATTN,), moe=(GPT_OSS_MOE,)),
}

# HF ``architectures[0]`` / ``model_type`` -> ARCHS key
BY_CLASS = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    # engineer "archs1"
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
}
BY_MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3",
                 "qwen2": "qwen2", "qwen2_moe": "qwen2_moe", "mixtral": "mixtral"}
# archs2
BY_CLASS.update({"Glm4MoeForCausalLM": "glm4_moe", "GptOssForCausalLM": "gpt_oss"})
BY_MODEL_TYPE.update({"glm4_moe": "glm4_moe", "gpt_oss": "gpt_oss"})


def symbols(d: ModelDims) -> dict[str, int]:
    """The shape symbols of the tables above, for these dims."""
    nh = d.num_heads
    return {
        "H": d.hidden,
        "H2": 2 * d.hidden,
        "V": d.vocab,
        "hd": d.head_dim,
        "Q": nh * d.head_dim,
        "KV": d.num_kv_heads * d.head_dim,
        "I": d.intermediate,
        "Im": d.moe_intermediate,
        "E": d.num_experts,
        "S": d.moe_intermediate * d.num_shared_experts,
        "QL": d.q_lora_rank,
        "QH": nh * (d.qk_nope_head_dim + d.qk_rope_head_dim),
        "KVA": d.kv_lora_rank + d.qk_rope_head_dim,
        "KVL": d.kv_lora_rank,
        "KVB": nh * (d.qk_nope_head_dim + d.v_head_dim),
        "OV": nh * d.v_head_dim,
        "1": 1,  # Qwen2-MoE shared_expert_gate [1, H]
        "NH": nh,  # archs2: gpt-oss sinks
        "Im2": 2 * d.moe_intermediate,  # archs2: gpt-oss interleaved gate_up
    }
