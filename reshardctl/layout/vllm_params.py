"""vLLM parameter names on one inference rank, with the HF segments inside them; the row runs of ``qkv_proj``.

The names are those of ``model.named_parameters()`` on the rank as vLLM builds the model (``vllm/model_executor/
models/<arch>.py``, layers in ``vllm/model_executor/layers/``): q/k/v fused in ``qkv_proj`` (``QKVParallelLinear``:
``[q_r | k_(r//rep) | v_(r//rep)]``, ``vllm_qkv_runs``; Qwen2's and GLM's biases in ``qkv_proj.bias``), gate and up
merged in ``gate_up_proj`` (``[gate_r; up_r]``; Qwen2-MoE's shared expert is ``mlp.shared_expert``), MLA's q_a/kv_a in
``fused_qkv_a_proj``, routed experts stacked in ``FusedMoE``'s ``w13_weight [E_local, 2*I_tp, H]`` and ``w2_weight
[E_local, H, I_tp]`` (Mixtral's under ``block_sparse_moe.``), the vocabulary padded to ``ceil(V/64)*64`` rows split by
TP (``lm_head`` tied to the embedding on the last stage with PP > 1), GLM-4.5's router in fp32.

``local_params`` offsets: a 3-D fused expert param holds 2-D HF boxes; the segment offset then has one more leading
entry, the local expert slot (``param[k, r0:r1, c0:c1]``); an expert an EPLB map puts in two slots of one rank has a
segment per slot (same ``(hf_name, box)``, the first the primary). A block-fp8 scale of a fused weight is a segment of
the fused parameter's ``weight_scale_inv`` at the weight's offset in blocks (``_scale_param``). MTP draft parameters
carry vLLM's ``DeepSeekMTP._rewrite_spec_layer_name`` names (``model.layers.{L}.mtp_block.*``; the draft's embedding
is ``model.embed_tokens.weight``) under a ``draft/`` prefix, since the draft is a separate module next to the target
model on the same rank. gpt-oss is refused (its experts are stored transposed). Which rank holds which box is
``layout/vllm.py``'s; ``tests/layout/test_vllm_modules.py`` checks every name, shape, dtype and offset against vLLM's
own parameters and loaders (``tests/helpers/vllm_modules.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from reshardctl.errors import LayoutError
from reshardctl.layout.fp8_rules import fp8_block_size
from reshardctl.layout.placement import LocalParam, LocalSegment, Placement, box_shape
from reshardctl.layout.shard_rules import ceil_div
from reshardctl.models.architectures import EXPERT_KINDS, QKV_BIAS_KINDS
from reshardctl.models.spec import KINDS, TensorSpec

if TYPE_CHECKING:
    from reshardctl.layout.vllm import VllmLayout

_FUSED = {"mlp_gate": "mlp.gate_up_proj.weight", "mlp_up": "mlp.gate_up_proj.weight",
          "shared_gate": "mlp.shared_experts.gate_up_proj.weight", "shared_up": "mlp.shared_experts.gate_up_proj.weight"}
# Qwen2MoeSparseMoeBlock.shared_expert = Qwen2MoeMLP (qwen2_moe.py)
_FUSED_QWEN2_MOE = dict(_FUSED, shared_gate="mlp.shared_expert.gate_up_proj.weight",
                        shared_up="mlp.shared_expert.gate_up_proj.weight")
MOE_MODULE = {"mixtral": "block_sparse_moe."}  # the FusedMoE's parent module where it is not "mlp."
_MTP_OUTER = frozenset({"mtp_enorm", "mtp_hnorm", "mtp_eh_proj", "mtp_head_norm", "lm_head"})
FP32_ROUTER = frozenset({"glm4_moe"})  # glm4_moe.py Glm4MoE.__init__: the gate is nn.Linear(dtype=torch.float32)


def vllm_qkv_runs(nh: int, nkv: int, hd: int, tp: int, r: int) -> list[tuple[str, int, int, int]]:
    """Row runs ``(tensor, hf_row_start, hf_row_end, local_row_start)`` of ``qkv_proj`` on TP rank ``r``."""
    q = nh // tp * hd
    kvh = max(1, nkv // tp)
    rep = max(1, tp // nkv)
    k0 = (r // rep) * kvh * hd
    return [("q", r * q, (r + 1) * q, 0), ("k", k0, k0 + kvh * hd, q), ("v", k0, k0 + kvh * hd, q + kvh * hd)]


def _local_expert_slots(lay: VllmLayout, t: TensorSpec, ep_rank: int) -> tuple[list[int], int]:
    """(local slots of expert ``t.expert`` on ``ep_rank``, number of local slots). An EPLB map may put
    one logical expert in several physical slots of one rank: all of them, in slot order."""
    if lay.expert_map is None:
        return [t.expert], lay.model.dims.num_experts
    slots = [k for j, k in lay.expert_map.holders(t.layer, t.expert) if j == ep_rank]
    assert slots, (t.name, ep_rank)
    return slots, lay.expert_map.local_count(t.layer, ep_rank)


def vllm_local_params(lay: VllmLayout, rank: int) -> list[LocalParam]:
    """vLLM's parameters on ``rank`` (names, local shapes, dtypes) with the HF segments inside them."""
    return _params(lay, rank, every_expert=True)


def vllm_param_names(lay: VllmLayout, rank: int) -> list[str]:
    """The names of vLLM's parameters on ``rank`` (what its ``named_parameters()`` lists), in the order of
    ``vllm_local_params``, without building their segments: a fused expert parameter (``w13_weight``,
    ``w2_weight`` and their scales) is the same for every expert of its layer, so the walk builds one
    expert per layer and kind (DeepSeek-V3 at tp=32, rank 0: about 1,000 of the 45,395 tensors it holds)."""
    return [p.name for p in _params(lay, rank, every_expert=False)]


def _params(lay: VllmLayout, rank: int, every_expert: bool) -> list[LocalParam]:
    """``vllm_local_params``; ``every_expert`` False: each fused expert parameter with the segment of the
    first expert it holds only (the names, shapes and dtypes are those of ``vllm_local_params``)."""
    d = lay.model.dims
    if d.arch == "gpt_oss":  # archs2
        raise LayoutError(
            "vLLM gpt-oss parameters are not expressible as HF boxes at offsets: gpt_oss.py "
            "_load_weights_other stores mlp.experts.w13_weight = gate_up_proj[e, :, cols].permute(0, 2, 1) and "
            "w2_weight = down_proj[e, rows, :].permute(0, 2, 1) (transposed), so the binding is refused; the "
            "placements (which rank holds which box) are exact and can be planned and predicted",
            hint="docs/layouts.md, \"GLM-4.5 MoE and gpt-oss\"")
    stage, j = lay._rank_slot[rank]
    n_attn, idx_attn = lay._attn_split("q") if d.num_heads else (lay.tp, lay._tp_of)
    t_rank = idx_attn[j]
    runs = {n: loc for n, _, _, loc in vllm_qkv_runs(d.num_heads, d.num_kv_heads, d.head_dim, n_attn, t_rank)} \
        if not lay.mla and d.num_heads else {}
    qkv_rows = (d.num_heads // n_attn + 2 * max(1, d.num_kv_heads // n_attn)) * d.head_dim if runs else 0
    i_tp = d.moe_intermediate // lay.moe_tp if lay.moe else 0
    params: dict[str, tuple[tuple[int, ...], str, list[LocalSegment]]] = {}

    def add(name, shape, dtype, hf, box, offset):
        entry = params.get(name)
        if entry is None:
            entry = params[name] = (shape, dtype, [])
        entry[2].append(LocalSegment(hf, box, name, offset))

    def where(t: TensorSpec, box) -> tuple[str, tuple[int, ...], list[tuple[int, ...]]]:
        """(vLLM parameter name, its local shape, the offsets of ``box`` in it) of a weight."""
        kind = t.kind
        pre = t.name.rsplit(".", 2)[0] + "." if t.layer is not None else ""
        lp = f"model.layers.{t.layer}." if t.layer is not None else ""
        zero = (0,) * len(t.shape)
        if kind in ("q", "k", "v") and runs:
            return pre + "qkv_proj.weight", (qkv_rows, t.shape[1]), [(runs[kind], 0)]
        if kind in QKV_BIAS_KINDS and runs:  # archs1
            return pre + "qkv_proj.bias", (qkv_rows,), [(runs[QKV_BIAS_KINDS[kind]],)]
        if kind in _FUSED:
            per = box[0][1] - box[0][0]
            fused = _FUSED_QWEN2_MOE if d.arch == "qwen2_moe" else _FUSED
            return lp + fused[kind], (2 * per, t.shape[1]), [(per if kind.endswith("up") else 0, 0)]
        if kind in ("q_a", "kv_a") and d.q_lora_rank:
            rows = d.q_lora_rank + d.kv_lora_rank + d.qk_rope_head_dim
            return pre + lay.fused_qkv_a, (rows, t.shape[1]), [(0 if kind == "q_a" else d.q_lora_rank, 0)]
        if kind in EXPERT_KINDS:
            slots, n_local = _local_expert_slots(lay, t, lay._ep_of[j])
            moe = lp + MOE_MODULE.get(d.arch, "mlp.")
            if kind == "expert_down":
                name, shape, off = moe + "experts.w2_weight", (n_local, t.shape[0], i_tp), (0, 0)
            else:
                name, shape = moe + "experts.w13_weight", (n_local, 2 * i_tp, t.shape[1])
                off = (i_tp if kind == "expert_up" else 0, 0)
            # the first slot is the primary; the others duplicate copies (LocalSegment)
            return name, shape, [(k,) + off for k in slots]
        if kind in ("embed", "lm_head"):
            head = kind == "lm_head" or (lay._tied_pp and t.layer is None and stage == lay.pp - 1)
            vsplit = lay._vocab_split("lm_head" if head else "embed")
            name = lay.tied_last_name if head and kind == "embed" else t.name
            shape = (lay.padded_vocab() // vsplit[0],) + t.shape[1:] if vsplit else box_shape(box)
            return name, shape, [zero]
        return t.name, box_shape(box), [zero]

    own = lay._stage_ranks[stage]

    def boxes_of(pl: Placement):
        if pl.ranks is own:  # the common case: a placement over this rank's stage, slot j
            return pl.template.holdings[j]
        if len(pl.ranks) > len(own):  # the tied embedding: first and last stage
            return pl.holding(rank)
        return ()

    seen: set[tuple] = set()  # (layer, kind, weight's kind) of the expert tensors looked at
    tensors = lay.model.tensors
    for i in _candidates(lay, boxes_of, every_expert).tolist():
        t = tensors[i]
        boxes = boxes_of(lay.placement(i))
        if not boxes:
            continue
        box = boxes[0]
        w = lay.model.tensor(t.scale_of) if t.kind == "scale_inv" else None
        if not every_expert and t.expert is not None:
            key = (t.layer, t.kind, w.kind if w is not None else None)
            if key in seen:
                continue
            seen.add(key)
        if w is None:
            name, shape, offsets = where(t, box)
        else:  # a block-fp8 scale: placed like its weight (same ranks, same slots)
            wbox = boxes_of(lay.placement(lay.model.index(w.name)))[0]
            name, shape, offsets = _scale_param(lay, t, box, w, where(w, wbox))
        if t.layer is not None and t.layer >= d.num_layers:
            name = _mtp_name(lay, name, w or t)
        dtype = "float32" if t.kind == "router" and d.arch in FP32_ROUTER else t.dtype  # archs2: GLM's fp32 gate
        for off in offsets:
            add(name, shape, dtype, t.name, box, off)
    return [LocalParam(n, shape, dt, tuple(segs)) for n, (shape, dt, segs) in params.items()]


def _candidates(lay: VllmLayout, boxes_of, every_expert: bool) -> np.ndarray:
    """The tensors the walk of ``_params`` looks at, in model order: those whose placement class holds a box
    on the rank (``boxes_of`` of the class's representative: a class is one template and one ranks tuple);
    without ``every_expert``, of the routed-expert tensors only the first of each (layer, kind, weight's
    kind), the one the walk keeps (the walk checks each again). One numpy pass, not a Python step per
    tensor (DeepSeek-V3: 45,395 tensors, about 1,000 looked at)."""
    m = lay.model
    classes, reps = lay.placement_classes()
    held = np.fromiter((bool(boxes_of(p)) for p in reps), dtype=bool, count=len(reps))[classes] \
        if len(classes) else np.zeros(0, dtype=bool)
    expert = m.expert_array >= 0
    if every_expert or not expert.any():
        return np.nonzero(held)[0]
    kinds = len(KINDS)
    weight_kind = np.full(len(expert), kinds, dtype=np.int64)  # a weight: no weight kind
    for i in np.nonzero(expert & (m.kind_codes == KINDS.index("scale_inv")))[0].tolist():
        weight_kind[i] = KINDS.index(m.tensor(m.tensors[i].scale_of).kind)
    key = (np.maximum(m.layer_array, 0) * kinds + m.kind_codes) * (kinds + 1) + weight_kind
    pick = np.nonzero(held & expert)[0]
    first = pick[np.unique(key[pick], return_index=True)[1]] if pick.size else pick
    return np.sort(np.concatenate([np.nonzero(held & ~expert)[0], first]))


def _scale_param(lay: VllmLayout, t: TensorSpec, box, w: TensorSpec, weight_param) -> tuple[str, tuple[int, ...], list]:
    """A block-fp8 ``weight_scale_inv`` of a weight fused into a vLLM parameter lives in that parameter's
    ``weight_scale_inv`` (``Fp8LinearMethod.create_weights``: ``[ceil(out_per_rank / block_n),
    ceil(in_per_rank / block_k)]``; ``Fp8MoEMethod.create_weights``: ``w13_weight_scale_inv
    [E_local, 2 * ceil(I_tp / block_n), ceil(H / block_k)]``, ``w2_weight_scale_inv [E_local,
    ceil(H / block_n), ceil(I_tp / block_k)]``), at the weight's offsets in blocks (the merged and QKV
    loaders' ``(shard_offset + block_n - 1) // block_n``). Any other scale keeps its HF name."""
    name, wshape, woffs = weight_param
    if name == w.name:
        return t.name, box_shape(box), [(0,) * len(t.shape)]
    bn, bk = fp8_block_size(lay.model)  # not None: the model has scales
    lead = len(wshape) - 2
    rows, cols = wshape[lead:]
    if w.kind in ("expert_gate", "expert_up"):  # two halves of ceil(I_tp / block_n) rows each
        half = ceil_div(rows // 2, bn)
        return name + "_scale_inv", wshape[:lead] + (2 * half, ceil_div(cols, bk)), \
            [o[:lead] + (half if o[lead] else 0, 0) for o in woffs]
    shape = wshape[:lead] + (ceil_div(rows, bn), ceil_div(cols, bk))
    return name + "_scale_inv", shape, [o[:lead] + (ceil_div(o[lead], bn), ceil_div(o[lead + 1], bk))
                                        for o in woffs]


def _mtp_name(lay: VllmLayout, name: str, t: TensorSpec) -> str:
    """vLLM's MTP draft names (``DeepSeekMTP._rewrite_spec_layer_name``), under ``draft/``."""
    prefix = f"model.layers.{t.layer}."
    if t.kind == "embed":
        return "draft/model.embed_tokens.weight"
    if t.kind in _MTP_OUTER or t.kind == "scale_inv" and lay.model.tensor(t.scale_of).kind in _MTP_OUTER:
        return "draft/" + name
    return "draft/" + name.replace(prefix, prefix + "mtp_block.", 1)
