"""vLLM's block-FP8 shape rules: which tensor-parallel sizes a block-quantized checkpoint can be served at.

Source: ``vllm/model_executor/layers/quantization/utils/fp8_utils.py::validate_fp8_block_shape`` (called by
``Fp8LinearMethod.create_weights``) and ``Fp8MoEMethod.create_weights`` (``quantization/fp8.py``):

* row parallel (the layer's tp > 1 and its input is split): input per rank % block_k == 0;
* column parallel (tp > 1, output split): every local output partition % block_n == 0;
  merged but not split (tp 1, e.g. DeepSeek's replicated ``fused_qkv_a_proj``): every partition but the
  last % block_n == 0;
* fused MoE with moe tp > 1: ``intermediate_size_per_partition`` % block_n == 0 and % block_k == 0.

Layers built with ``disable_tp=True`` have tp 1 and are not checked. The rules apply only when the
inference weights are block FP8 (the model view carries ``weight_scale_inv`` tensors).
"""

from __future__ import annotations

from reshardctl.models.spec import ModelSpec


def fp8_block_size(model: ModelSpec) -> tuple[int, int] | None:
    """``(block_n, block_k)`` when the model view is block FP8 (has scale tensors), else None."""
    if not any(t.kind == "scale_inv" for t in model.tensors):
        return None
    qc = model.config.get("quantization_config") or {}
    bs = qc.get("weight_block_size") or [128, 128]
    return int(bs[0]), int(bs[1])


def _row(problems, what, name, total, tp, bk):
    if tp > 1:
        per = total // tp
        if per % bk:
            problems.append(f"vLLM block-fp8: {what} (RowParallelLinear) input per rank {name} {total} / tp {tp} = "
                            f"{per} is not a multiple of block_k {bk} ({per} % {bk} = {per % bk}); vLLM's "
                            f"validate_fp8_block_shape refuses it")


def _col(problems, what, parts: list[tuple[str, int]], tp, bn):
    """``parts``: (name, global output size) of each merged partition."""
    if tp > 1:
        check = parts
    elif len(parts) > 1:
        check = parts[:-1]  # merged, not split: the last partition may be ragged
    else:
        return
    for name, total in check:
        per = total // tp
        if per % bn:
            split = f"{total} / tp {tp} = {per}" if tp > 1 else f"{per}"
            problems.append(f"vLLM block-fp8: {what} output partition {name} {split} is not a multiple of "
                            f"block_n {bn} ({per} % {bn} = {per % bn}); vLLM's validate_fp8_block_shape refuses it")


def check_vllm_fp8(model: ModelSpec, *, tp: int, shared_tp: int, moe_tp: int, problems: list[str]) -> None:
    """Append vLLM's block-FP8 refusals for attention/dense tp ``tp``, shared-expert tp ``shared_tp``
    (1 when replicated under sequence-parallel MoE) and fused-MoE tp ``moe_tp`` (1 under expert parallel)."""
    bs = fp8_block_size(model)
    if bs is None:
        return
    bn, bk = bs
    d = model.dims
    kinds = {t.kind for t in model.tensors if t.dtype.startswith("float8")}
    if d.kv_lora_rank:
        qk = d.qk_nope_head_dim + d.qk_rope_head_dim
        if "q_b" in kinds:
            _col(problems, "self_attn.q_b_proj", [("q_b_proj", d.num_heads * qk)], tp, bn)
            _col(problems, "self_attn.fused_qkv_a_proj", [("q_a_proj", d.q_lora_rank),
                                                          ("kv_a_proj_with_mqa", d.kv_lora_rank + d.qk_rope_head_dim)],
                 1, bn)
        elif "q" in kinds:
            _col(problems, "self_attn.q_proj", [("q_proj", d.num_heads * qk)], tp, bn)
        if "kv_b" in kinds:
            _col(problems, "self_attn.kv_b_proj", [("kv_b_proj", d.num_heads * (d.qk_nope_head_dim + d.v_head_dim))],
                 tp, bn)
        if "o" in kinds:
            _row(problems, "self_attn.o_proj", "num_heads*v_head_dim", d.num_heads * d.v_head_dim, tp, bk)
    elif "q" in kinds:
        kv_total = max(d.num_kv_heads, tp) * d.head_dim  # kv heads replicated when tp > nkv
        _col(problems, "self_attn.qkv_proj", [("q", d.num_heads * d.head_dim), ("k", kv_total), ("v", kv_total)],
             tp, bn)
        _row(problems, "self_attn.o_proj", "num_heads*head_dim", d.num_heads * d.head_dim, tp, bk)
    if "mlp_gate" in kinds:
        _col(problems, "mlp.gate_up_proj", [("gate_proj", d.intermediate), ("up_proj", d.intermediate)], tp, bn)
        _row(problems, "mlp.down_proj", "intermediate_size", d.intermediate, tp, bk)
    if "shared_gate" in kinds:
        s = d.moe_intermediate * d.num_shared_experts
        _col(problems, "mlp.shared_experts.gate_up_proj", [("gate_proj", s), ("up_proj", s)], shared_tp, bn)
        _row(problems, "mlp.shared_experts.down_proj", "shared intermediate", s, shared_tp, bk)
    if "expert_gate" in kinds and moe_tp > 1:
        per = d.moe_intermediate // moe_tp
        for b, name in ((bn, "block_n"), (bk, "block_k")):
            if per % b:
                problems.append(f"vLLM block-fp8: fused MoE intermediate per rank moe_intermediate_size "
                                f"{d.moe_intermediate} / moe tp {moe_tp} = {per} is not a multiple of {name} {b} "
                                f"({per} % {b} = {per % b}); vLLM's Fp8MoEMethod.create_weights refuses it")
                break
