"""vLLM inference layout (layout-rules §3): who holds which box of every HF tensor.

Ranks: ``arange(world).reshape(DP, PP, TP)`` (TP innermost): ``rank = tp + TP*(pp + PP*dp)``. Templates are
over the ``DP*TP`` ranks of one pipeline stage, slot ``j = dp*TP + tp`` (= vLLM's flattened MoE rank);
every DP replica is a full copy of the non-expert weights (replica slots).

Rules: ``qkv_proj = [q_r | k_(r//rep) | v_(r//rep)]`` with ``rep = TP/nkv`` KV replicas when TP > nkv;
merged gate_up ``[gate_r; up_r]``; row-parallel o/down; vocab padded to ``ceil(V/64)*64`` split by TP, real
rows only in boxes (padding is zero-filled in the param); experts with expert parallel ON: EP over the
flattened DP*TP ranks, ``base, rem = divmod(E, ep)``, the first ``rem`` ranks get ``base+1`` (linear);
OFF: every expert TP-sharded over the DP*TP ranks (gate/up rows, down columns). MLA: q_a and kv_a
replicated (``fused_qkv_a_proj``), q_b/kv_b column, o row; router, bias and norms replicated; MTP
``eh_proj`` is a plain ``nn.Linear`` (replicated). Pipeline: ``[L//PP]*PP`` with the remainder on the stages
just before the last; MTP layers go to the last stage (that is where vLLM's DeepSeekMTP draft model runs
next to the lm_head; our choice for a single-engine view).
fp8 ``scale_inv`` follows its weight at 128-block granularity (``shard_rules.scale_template``).

``local_params`` offsets: a 3-D fused expert param (``w13_weight [E_local, 2*I_tp, H]``) holds 2-D HF boxes;
the segment offset then has one more leading entry, the local expert index (``param[e, r0:r1, c0:c1]``).
"""

from __future__ import annotations

from reshardctl.errors import LayoutError
from reshardctl.layout.parallel_spec import ParallelSpec
from reshardctl.layout.placement import LocalParam, LocalSegment, Placement, ShardTemplate, box_shape
from reshardctl.layout.shard_rules import (
    Interner, StagedPlacements, ceil_div, frac, need_divides, replicated_template, split_template, vllm_pp_parts,
)
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec, TensorSpec

VOCAB_PAD = 64

REPLICATED_KINDS = frozenset({
    "final_norm", "input_norm", "post_attn_norm", "q_norm", "k_norm", "q_a_norm", "kv_a_norm", "router",
    "router_bias", "mtp_enorm", "mtp_hnorm", "mtp_head_norm", "mtp_eh_proj", "q_a", "kv_a",
})
ROW_SPLIT_KINDS = frozenset({"mlp_gate", "mlp_up", "shared_gate", "shared_up", "q_b", "kv_b", "q"})
COL_SPLIT_KINDS = frozenset({"o", "mlp_down", "shared_down"})
EXPERT_KINDS = frozenset({"expert_gate", "expert_up", "expert_down"})
_FUSED = {"mlp_gate": "mlp.gate_up_proj.weight", "mlp_up": "mlp.gate_up_proj.weight",
          "shared_gate": "mlp.shared_experts.gate_up_proj.weight", "shared_up": "mlp.shared_experts.gate_up_proj.weight"}


def vllm_padded_vocab(vocab: int) -> int:
    return ceil_div(vocab, VOCAB_PAD) * VOCAB_PAD


def vllm_expert_ranges(num_experts: int, ep: int) -> list[tuple[int, int]]:
    """Linear EP placement: ``[start, end)`` per EP rank, the first ``E % ep`` ranks one more."""
    base, rem = divmod(num_experts, ep)
    return [(j * base + min(j, rem), (j + 1) * base + min(j + 1, rem)) for j in range(ep)]


def vllm_qkv_runs(nh: int, nkv: int, hd: int, tp: int, r: int) -> list[tuple[str, int, int, int]]:
    """Row runs ``(tensor, hf_row_start, hf_row_end, local_row_start)`` of ``qkv_proj`` on TP rank ``r``."""
    q = nh // tp * hd
    kvh = max(1, nkv // tp)
    rep = max(1, tp // nkv)
    k0 = (r // rep) * kvh * hd
    return [("q", r * q, (r + 1) * q, 0), ("k", k0, k0 + kvh * hd, q), ("v", k0, k0 + kvh * hd, q + kvh * hd)]


class VllmLayout(StagedPlacements, SideLayout):
    side = "infer"

    def __init__(self, model: ModelSpec, spec: ParallelSpec, world_size: int | None = None):
        self.model, self.spec = model, spec
        d = model.dims
        problems: list[str] = []
        TP, PP = spec.tp, spec.pp
        ep_on = spec.expert_parallel if spec.expert_parallel is not None else spec.ep > 1
        if spec.dp is not None:
            DP = spec.dp
        elif spec.ep > 1 and spec.ep % TP == 0:
            DP = spec.ep // TP
        elif world_size is not None and world_size % (TP * PP) == 0:
            DP = world_size // (TP * PP)
        else:
            DP = 1
        for key in ("etp", "first_stage_layers", "last_stage_layers"):
            if getattr(spec, key) is not None:
                problems.append(f"{key} is a Megatron option, not a vLLM one")
        if spec.cp != 1 or spec.vpp != 1:
            problems.append("cp/vpp are Megatron options, not vLLM ones")
        if spec.ep > 1 and spec.ep != DP * TP:
            problems.append(f"vLLM ep={spec.ep} must equal dp({DP}) x tp({TP}) = {DP * TP} "
                            f"(vLLM's expert-parallel group is the flattened DP x TP ranks)")
        if spec.ep > 1 and spec.expert_parallel is False:
            problems.append(f"ep={spec.ep} contradicts expert_parallel=false")
        self.tp, self.pp, self.dp, self.expert_parallel = TP, PP, DP, ep_on
        self.world_size = DP * PP * TP
        self.factors = (("tp", TP), ("pp", PP), ("dp", DP))
        if world_size is not None and world_size != self.world_size:
            problems.append(f"world size tp({TP}) x pp({PP}) x dp({DP}) = {self.world_size} ranks, "
                            f"but {world_size} were given")
        self.stage_size = M = DP * TP
        self.mla = d.kv_lora_rank > 0
        self.moe = d.num_experts > 0 and bool(d.moe_layers)
        need_divides(problems, TP, d.num_heads, f"vLLM tp={TP}", "num_attention_heads")
        if not self.mla and d.num_kv_heads:
            nkv = d.num_kv_heads
            if TP >= nkv and TP % nkv:
                problems.append(f"vLLM tp={TP} > num_kv_heads={nkv} requires {TP} % {nkv} == 0 "
                                f"({TP} % {nkv} = {TP % nkv})")
            elif TP < nkv:
                need_divides(problems, TP, nkv, f"vLLM tp={TP}", "num_kv_heads")
        vp = vllm_padded_vocab(d.vocab)
        if vp % TP:
            problems.append(f"vLLM tp={TP} does not divide the padded vocab {vp} = ceil({d.vocab}/64)*64 "
                            f"({frac(vp, TP)})")
        if any(t.kind == "mlp_gate" for t in model.tensors):
            need_divides(problems, TP, d.intermediate, f"vLLM tp={TP}", "intermediate_size")
        if self.moe:
            if d.num_shared_experts:
                need_divides(problems, TP, d.moe_intermediate * d.num_shared_experts, f"vLLM tp={TP}",
                             "shared expert intermediate size")
            if ep_on:
                if d.num_experts < M:
                    problems.append(f"vLLM expert parallel over dp({DP}) x tp({TP}) = {M} ranks needs "
                                    f"num_experts >= {M} (has {d.num_experts})")
            else:
                need_divides(problems, M, d.moe_intermediate, f"vLLM MoE tensor parallel dp({DP}) x tp({TP}) = {M}",
                             "moe_intermediate_size")
                if d.arch == "qwen3_moe" and TP > d.num_experts:
                    problems.append(f"vLLM Qwen3-MoE: tp={TP} > num_experts={d.num_experts} without expert parallel")
        elif spec.ep > 1:
            problems.append(f"vLLM ep={spec.ep} given but model {model.name} has no routed experts")
        L = d.num_layers
        if PP > L:
            problems.append(f"vLLM pp={PP} > {L} layers")
        if problems:
            raise LayoutError(problems, hint=f"model {model.name}; infer layout {self.describe()}")
        self.pp_parts = vllm_pp_parts(L, PP)
        self._layer_stage: dict[int, int] = {}
        g = 0
        for p, n in enumerate(self.pp_parts):
            for _ in range(n):
                self._layer_stage[g] = p
                g += 1
        for k in range(d.num_mtp_layers):
            self._layer_stage[L + k] = PP - 1
        self._stage_ranks = tuple(tuple(t + TP * (p + PP * dp) for dp in range(DP) for t in range(TP))
                                  for p in range(PP))
        self._rank_slot = {r: (p, j) for p, rs in enumerate(self._stage_ranks) for j, r in enumerate(rs)}
        self.expert_ranges = vllm_expert_ranges(d.num_experts, M) if self.moe and ep_on else []
        self._owner = [j for j, (a, b) in enumerate(self.expert_ranges) for _ in range(a, b)]
        self._templates = Interner()
        self._placements = Interner()
        self._by_index: list[Placement | None] = [None] * len(model.tensors)

    # ------------------------------------------------------------------ public
    def describe(self) -> str:
        s = f"vllm tp={self.tp},pp={self.pp},dp={self.dp}"
        if self.moe:
            s += f",expert_parallel={'on' if self.expert_parallel else 'off'}"
        return s

    def coords(self, rank: int) -> dict[str, int]:
        return {"dp": rank // (self.tp * self.pp), "pp": (rank // self.tp) % self.pp, "tp": rank % self.tp}

    def padded_vocab(self) -> int:
        return vllm_padded_vocab(self.model.dims.vocab)

    def _tensor_placement(self, t: TensorSpec, stage: int) -> Placement:
        kind = t.kind
        block = self._owner[t.expert] if (t.expert is not None and self.expert_parallel) else -1
        key = (kind, t.shape, stage, block)
        p = self._placements._d.get(key)
        if p is None:
            p = self._placements.get(key, lambda: Placement(
                self._templates.get((kind, t.shape, block), lambda: self._build_template(kind, t.shape, block)),
                self._stage_ranks[stage]))
        return p

    # ------------------------------------------------------------------ internals
    def _build_template(self, kind: str, shape: tuple[int, ...], block: int) -> ShardTemplate:
        M, TP = self.stage_size, self.tp
        d = self.model.dims
        tp_idx = [j % TP for j in range(M)]
        if kind in REPLICATED_KINDS:
            return replicated_template(shape, M)
        if kind in ("embed", "lm_head"):
            return split_template(shape, 0, TP, tp_idx, per=vllm_padded_vocab(shape[0]) // TP, limit=shape[0])
        if kind in ("k", "v") and not self.mla:
            kvh = max(1, d.num_kv_heads // TP)
            rep = max(1, TP // d.num_kv_heads)
            return split_template(shape, 0, shape[0] // (kvh * d.head_dim), [t // rep for t in tp_idx],
                                  per=kvh * d.head_dim)
        if kind in ROW_SPLIT_KINDS:
            return split_template(shape, 0, TP, tp_idx)
        if kind in COL_SPLIT_KINDS:
            return split_template(shape, 1, TP, tp_idx)
        if kind in EXPERT_KINDS:
            if self.expert_parallel:
                return ShardTemplate(shape, tuple(((tuple((0, n) for n in shape)),) if j == block else ()
                                                  for j in range(M)))
            return split_template(shape, 1 if kind == "expert_down" else 0, M, list(range(M)))
        return replicated_template(shape, M)

    def local_params(self, rank: int) -> list[LocalParam]:
        d = self.model.dims
        stage, j = self._rank_slot[rank]
        t_rank = j % self.tp
        runs = {n: loc for n, _, _, loc in vllm_qkv_runs(d.num_heads, d.num_kv_heads, d.head_dim, self.tp, t_rank)} \
            if not self.mla and d.num_heads else {}
        qkv_rows = (d.num_heads // self.tp + 2 * max(1, d.num_kv_heads // self.tp)) * d.head_dim if runs else 0
        vrows = self.padded_vocab() // self.tp
        if self.expert_parallel and self.moe:
            e0, e1 = self.expert_ranges[j]
            i_tp = d.moe_intermediate
        else:
            e0, e1 = 0, d.num_experts
            i_tp = d.moe_intermediate // self.stage_size if self.moe else 0
        params: dict[str, tuple[tuple[int, ...], str, list[LocalSegment]]] = {}

        def add(name, shape, dtype, hf, box, offset):
            entry = params.get(name)
            if entry is None:
                entry = params[name] = (shape, dtype, [])
            entry[2].append(LocalSegment(hf, box, name, offset))

        for i, t in enumerate(self.model.tensors):
            if self.stage_of(i) != stage:
                continue
            boxes = self.placement(i).holding(rank)
            if not boxes:
                continue
            box = boxes[0]
            kind = t.kind
            pre = t.name.rsplit(".", 2)[0] + "." if t.layer is not None else ""
            lp = f"model.layers.{t.layer}." if t.layer is not None else ""
            zero = (0,) * len(t.shape)
            if kind in ("q", "k", "v") and runs:
                add(pre + "qkv_proj.weight", (qkv_rows, t.shape[1]), t.dtype, t.name, box, (runs[kind], 0))
            elif kind in _FUSED:
                per = t.shape[0] // self.tp
                add(lp + _FUSED[kind], (2 * per, t.shape[1]), t.dtype, t.name, box,
                    (per if kind.endswith("up") else 0, 0))
            elif kind in ("q_a", "kv_a") and d.q_lora_rank:
                rows = d.q_lora_rank + d.kv_lora_rank + d.qk_rope_head_dim
                add(pre + "fused_qkv_a_proj.weight", (rows, t.shape[1]), t.dtype, t.name, box,
                    (0 if kind == "q_a" else d.q_lora_rank, 0))
            elif kind in ("expert_gate", "expert_up"):
                add(lp + "mlp.experts.w13_weight", (e1 - e0, 2 * i_tp, t.shape[1]), t.dtype, t.name, box,
                    (t.expert - e0, i_tp if kind == "expert_up" else 0, 0))
            elif kind == "expert_down":
                add(lp + "mlp.experts.w2_weight", (e1 - e0, t.shape[0], i_tp), t.dtype, t.name, box,
                    (t.expert - e0, 0, 0))
            elif kind in ("embed", "lm_head"):
                add(t.name, (vrows,) + t.shape[1:], t.dtype, t.name, box, zero)
            else:
                add(t.name, box_shape(box), t.dtype, t.name, box, zero)
        return [LocalParam(n, shape, dt, tuple(segs)) for n, (shape, dt, segs) in params.items()]
