"""Megatron-Core parameter names on one rank, with the HF segments inside them; the row runs of ``linear_qkv``.

The names are those of ``model.named_parameters()`` (plus the router's ``expert_bias`` buffer, a ``LocalParam`` with
``buffer=True``: ``named_buffers()``) on the rank, as
megatron-core 0.19 builds ``GPTModel`` (``megatron/core/models/gpt/gpt_model.py``: ``embedding.word_embeddings``,
``decoder.layers``, ``decoder.final_layernorm``, ``output_layer``, ``mtp.layers``) with one of two layer specs
(``megatron/core/models/gpt/gpt_layer_specs.py``):

- ``spec="te"``: ``get_gpt_layer_with_transformer_engine_spec`` with grouped-GEMM experts (the names
  Megatron-Bridge's HF mappings use): TE fused norms (``linear_qkv.layer_norm_weight``,
  ``mlp.linear_fc1.layer_norm_weight``; MLA ``input_layernorm.weight`` and ``linear_q_up_proj.layer_norm_weight``
  / ``linear_kv_up_proj.layer_norm_weight``), experts ``mlp.experts.linear_fc1.weight{i}`` (TEGroupedMLP);
- ``spec="local"``: ``get_gpt_layer_local_spec`` (megatron-core modules only): ``input_layernorm.weight``,
  ``pre_mlp_layernorm.weight``, MLA ``self_attention.q_layernorm.weight`` / ``kv_layernorm.weight`` and column
  parallel down projections (the layout must be built with the key ``mla_down_proj=column``; the TE spec's
  duplicated ones need ``replicated``, the default: either mismatch is refused, naming both), experts
  ``mlp.experts.local_experts.{i}.linear_fc1.weight`` (SequentialMLP).

Names use LOCAL layer indices (``decoder.layers.{local}``) and local expert indices (global expert
``= ep_rank*E_local + i``), and, with vpp > 1, a ``model{chunk}.`` prefix per virtual pipeline chunk (the list of
model chunks a training loop holds). MTP layers are ``mtp.layers.{k}.`` with the inner transformer layer under
``mtp_model_layer.`` (0.19 ``transformer/multi_token_prediction.py``; 0.16 and older named it
``transformer_layer.``). Vocab params have ``Vp/TP`` rows; rows not covered by a segment are padding.
Dtypes are those of a bf16 job's model (wrapped in ``Float16Module``, which casts every parameter to the model
dtype): the router's ``expert_bias`` buffer is fp32 (``TopKRouter._maintain_float32_expert_bias``); fp8 HF
weights are bf16 in the trainer. GLM-4.5's q/k/v biases are ``self_attention.linear_qkv.bias`` (Megatron-Bridge
``GLM45Bridge``: ``QKVMapping`` on the biases). tests/layout/megatron_core/ holds what megatron-core builds, per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reshardctl.errors import LayoutError
from reshardctl.layout.placement import LocalParam, LocalSegment, box_shape
from reshardctl.layout.shard_rules import ceil_div

if TYPE_CHECKING:
    from reshardctl.layout.megatron import MegatronLayout

_ATTN = {
    "q_norm": "self_attention.q_layernorm.weight",
    "k_norm": "self_attention.k_layernorm.weight",
    "o": "self_attention.linear_proj.weight",
    "q_a": "self_attention.linear_q_down_proj.weight",
    "q_a_norm": "self_attention.linear_q_up_proj.layer_norm_weight",
    "q_b": "self_attention.linear_q_up_proj.weight",
    "kv_a": "self_attention.linear_kv_down_proj.weight",
    "kv_a_norm": "self_attention.linear_kv_up_proj.layer_norm_weight",
    "kv_b": "self_attention.linear_kv_up_proj.weight",
    "mlp_down": "mlp.linear_fc2.weight",
    "shared_down": "mlp.shared_experts.linear_fc2.weight",
    "router": "mlp.router.weight",
    "router_bias": "mlp.router.expert_bias",
    "shared_expert_gate": "mlp.shared_experts.gate_weight",  # archs1: Qwen2-MoE moe_shared_expert_gate
}
_MTP_OUTER = {
    "mtp_enorm": "enorm.weight",
    "mtp_hnorm": "hnorm.weight",
    "mtp_eh_proj": "eh_proj.weight",
    "mtp_head_norm": "final_layernorm.weight",
}


# kinds megatron-core holds in buffers: TopKRouter registers expert_bias with register_buffer (0.19.0
# transformer/moe/router.py:188-195; 0.16.1 the same), a buffer of the module, not one of its parameters
_BUFFER_KINDS = frozenset({"router_bias"})
# the local spec's names where they differ from the TE spec's
_ATTN_LOCAL = dict(_ATTN, q_a_norm="self_attention.q_layernorm.weight", kv_a_norm="self_attention.kv_layernorm.weight")
MEGATRON_SPECS = ("te", "local")
# the MLA down-projection split each layer spec builds (docs/layouts.md: multi_latent_attention.py:526,532,573,579)
_MLA_DOWN_PROJ_OF_SPEC = {"te": "replicated", "local": "column"}


def _dtype(kind: str, dtype: str) -> str:
    if kind == "router_bias":
        return "float32"
    return "bfloat16" if dtype.startswith("float8") else dtype


def megatron_qkv_runs(np_: int, ng: int, hn: int, tp: int, r: int) -> list[tuple[str, int, int, int]]:
    """Row runs ``(tensor, hf_row_start, hf_row_end, local_row_start)`` of TP rank ``r``'s ``linear_qkv``.

    Global rows are interleaved per query group ``[q heads of g | k_g | v_g]``; TP splits them contiguously.
    """
    qpg = np_ // ng
    block = (qpg + 2) * hn
    per = ng * block // tp
    lo, hi = r * per, (r + 1) * per
    runs: list[tuple[str, int, int, int]] = []
    for g in range(lo // block, min(ng, ceil_div(hi, block))):
        base = g * block
        for name, s, e, hf0 in (("q", base, base + qpg * hn, g * qpg * hn),
                                ("k", base + qpg * hn, base + (qpg + 1) * hn, g * hn),
                                ("v", base + (qpg + 1) * hn, base + block, g * hn)):
            a, b = max(s, lo), min(e, hi)
            if a < b:
                runs.append((name, hf0 + a - s, hf0 + b - s, a - lo))
    return runs


def megatron_local_params(lay: "MegatronLayout", rank: int, spec: str = "te") -> list[LocalParam]:
    if spec not in MEGATRON_SPECS:
        raise LayoutError(f"megatron layer spec {spec!r}: expected one of {', '.join(MEGATRON_SPECS)}")
    local_spec = spec == "local"
    want = _MLA_DOWN_PROJ_OF_SPEC[spec]
    if lay.mla and lay.mla_down_proj != want:
        built_as = (f"as ColumnParallelLinear (split over tp={lay.tp})" if local_spec else
                    "as TELinear parallel_mode='duplicated' (whole on every tp rank)")
        raise LayoutError(f"megatron layer spec {spec!r} builds MLA linear_q_down_proj / linear_kv_down_proj "
                          f"{built_as}, but the train layout has mla_down_proj={lay.mla_down_proj}"
                          + (" (the default)" if lay.spec.mla_down_proj is None else ""),
                          hint=f"give mla_down_proj={want} in the train parallel string (--train / "
                               f"plan_refit(train=...)) for a model built with the {spec!r} spec")
    attn = _ATTN_LOCAL if local_spec else _ATTN
    d = lay.model.dims
    c = lay.coords(rank)
    stage, tp, etp, epr = c["pp"], c["tp"], c["etp"], c["ep"]
    TP, ETP, L = lay.tp, lay.etp, d.num_layers
    vp_first = "model0." if lay.vpp > 1 else ""
    vp_last = f"model{lay.vpp - 1}." if lay.vpp > 1 else ""
    qkv_local: dict[tuple[str, int], int] = {}
    qkv_rows = 0
    if not lay.mla and d.num_heads:
        qkv_rows = (d.num_heads + 2 * d.num_kv_heads) * d.head_dim // TP
        qkv_local = {(n, a): loc for n, a, _, loc in megatron_qkv_runs(d.num_heads, d.num_kv_heads,
                                                                       d.head_dim, TP, tp)}
    vocab_rows = lay.padded_vocab() // TP
    params: dict[str, tuple[tuple[int, ...], str, list[LocalSegment]]] = {}
    buffers: set[str] = set()

    def add(name: str, shape: tuple[int, ...], dtype: str, hf: str, box, offset: tuple[int, ...]) -> None:
        entry = params.get(name)
        if entry is None:
            entry = params[name] = (shape, dtype, [])
        entry[2].append(LocalSegment(hf, box, name, offset))

    for i in lay.stage_tensor_indices(stage):
        t = lay.model.tensors[i]
        boxes = lay.placement(i).holding(rank)
        if not boxes:
            continue
        kind, dt = t.kind, _dtype(t.kind, t.dtype)
        if t.layer is not None:
            _, chunk, local = lay.layer_position(t.layer)
            vp = f"model{chunk}." if lay.vpp > 1 else ""
            if t.layer >= L:
                outer = f"{vp}mtp.layers.{local}."
                inner = outer + "mtp_model_layer."
            else:
                outer = inner = f"{vp}decoder.layers.{local}."
        else:
            outer = inner = ""
        for k, box in enumerate(boxes):
            zero = (0,) * len(t.shape)
            if kind in ("embed", "lm_head"):
                if kind == "embed" and t.layer is None:
                    on_last = lay.pp > 1 and stage == lay.pp - 1 and d.tie_embeddings
                    name = f"{vp_last}output_layer.weight" if on_last else f"{vp_first}embedding.word_embeddings.weight"
                elif kind == "embed":  # MTP embed_tokens: the last stage's embedding copy
                    name = f"{vp_last}embedding.word_embeddings.weight"
                else:
                    name = f"{vp_last}output_layer.weight"
                add(name, (vocab_rows,) + t.shape[1:], dt, t.name, box, zero)
            elif kind == "final_norm":
                add(f"{vp_last}decoder.final_layernorm.weight", t.shape, dt, t.name, box, zero)
            elif kind == "input_norm":
                fused = not (local_spec or lay.mla)
                sfx = "self_attention.linear_qkv.layer_norm_weight" if fused else "input_layernorm.weight"
                add(inner + sfx, t.shape, dt, t.name, box, zero)
            elif kind == "post_attn_norm":
                moe = t.layer in lay._moe_layers or (t.layer is not None and t.layer >= L and lay.moe)
                sfx = "pre_mlp_layernorm.weight" if (moe or local_spec) else "mlp.linear_fc1.layer_norm_weight"
                add(inner + sfx, t.shape, dt, t.name, box, zero)
            elif kind in ("q", "k", "v") and not lay.mla:
                add(inner + "self_attention.linear_qkv.weight", (qkv_rows, t.shape[1]), dt, t.name, box,
                    (qkv_local[(kind, box[0][0])], 0))
            elif kind in ("q_bias", "k_bias", "v_bias") and not lay.mla:  # Qwen2 / GLM-4.5 add_qkv_bias: rows as linear_qkv's
                add(inner + "self_attention.linear_qkv.bias", (qkv_rows,), dt, t.name, box,
                    (qkv_local[(kind[0], box[0][0])],))
            elif kind == "q":  # MLA without q_lora_rank
                add(inner + "self_attention.linear_q_proj.weight", box_shape(box), dt, t.name, box, zero)
            elif kind in ("mlp_gate", "mlp_up", "shared_gate", "shared_up"):
                per = t.shape[0] // TP
                sfx = "mlp.linear_fc1.weight" if kind.startswith("mlp") else "mlp.shared_experts.linear_fc1.weight"
                off = box[0][0] - tp * per + (per if kind.endswith("up") else 0)
                add(inner + sfx, (2 * per, t.shape[1]), dt, t.name, box, (off, 0))
            elif kind in ("expert_gate", "expert_up", "expert_down"):
                li = t.expert - epr * lay.experts_per_rank
                fc1, fc2 = ((f"mlp.experts.local_experts.{li}.linear_fc1.weight",
                             f"mlp.experts.local_experts.{li}.linear_fc2.weight") if local_spec else
                            (f"mlp.experts.linear_fc1.weight{li}", f"mlp.experts.linear_fc2.weight{li}"))
                if kind == "expert_down":
                    per = t.shape[1] // ETP
                    add(inner + fc2, (t.shape[0], per), dt, t.name, box, (0, box[1][0] - etp * per))
                else:
                    per = t.shape[0] // ETP
                    off = box[0][0] - etp * per + (per if kind == "expert_up" else 0)
                    add(inner + fc1, (2 * per, t.shape[1]), dt, t.name, box, (off, 0))
            elif kind in attn:
                add(inner + attn[kind], box_shape(box), dt, t.name, box, zero)
                if kind in _BUFFER_KINDS:
                    buffers.add(inner + attn[kind])
            elif kind in _MTP_OUTER:
                add(outer + _MTP_OUTER[kind], box_shape(box), dt, t.name, box, zero)
            else:  # scale_inv and anything unknown: one unfused param per box under the HF name
                name = t.name if len(boxes) == 1 else f"{t.name}#{k}"
                add(name, box_shape(box), dt, t.name, box, zero)
    return [LocalParam(n, shape, dt, tuple(segs), buffer=n in buffers) for n, (shape, dt, segs) in params.items()]
