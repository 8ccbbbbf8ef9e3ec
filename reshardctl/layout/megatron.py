"""Megatron-Core trainer layout: who holds which box of every HF tensor.

Sources (``NVIDIA/Megatron-LM``): ``megatron/core/parallel_state.py`` (``initialize_model_parallel``,
``RankGenerator``: the rank grids below), ``megatron/core/tensor_parallel/layers.py``
(``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding``),
``megatron/core/transformer/attention.py`` (``SelfAttention.get_query_key_value_tensors``: ``linear_qkv``
per query group), ``megatron/core/transformer/mlp.py`` (``apply_swiglu_sharded_factory``: gated fc1),
``megatron/core/transformer/moe/experts.py`` (``TEGroupedMLP``, ``SequentialMLP``) and
``megatron/training/tokenizer/tokenizer.py`` (``_vocab_size_with_padding``); docs/layouts.md lists them.

Ranks (``RankGenerator``, ``rank_order=``): with megatron-core's default order ``tp-cp-ep-dp-pp`` the dense
grid is ``rank = tp + TP*(cp + CP*(dp + DP*pp))`` and the expert grid ``rank = etp + ETP*(ep + EP*(edp + EDP*pp))``
(MoE parallel folding, ``etp`` defaults to ``tp``): pp outermost, so pipeline stage ``p`` is the contiguous
rank block ``[p*S, (p+1)*S)`` with ``S = TP*CP*DP = ETP*EP*EDP``. With ``tp-cp-ep-pp-dp`` (Megatron-Bridge
``use_tp_pp_dp_mapping=True``) dp is outermost: ``rank = tp + TP*(cp + CP*(pp + PP*dp))`` and
``etp + ETP*(ep + EP*(pp + PP*edp))``, which megatron-core allows with pp > 1 only when ``edp == dp``
(``ETP*EP == TP*CP``; a dense model's expert grid is built too, with ``etp = tp``, ``ep = 1``: no cp); a
stage is then ``DP`` blocks of ``TP*CP`` ranks, ``TP*CP*PP`` apart. Either way stage slot ``s``
(``tp + TP*(cp + CP*dp)`` = ``etp + ETP*(ep + EP*edp)``) is one rank of the stage (``stage_ranks``); every
template below is over those ``S`` stage-local slots, and dp/cp (dense) or edp (experts) replicas are slots
with identical holdings.

Rules: column-parallel rows / row-parallel columns split by TP; ``linear_qkv`` rows interleaved per query
group then split contiguously (a rank's rows need not end on a group boundary); gated fc1 stride 2
(``[gate_r; up_r]``); vocab rows ``V/TP`` per rank unpadded (Megatron-Bridge's default,
``should_pad_vocab=False``), or with ``vocab_divisor=d`` padded to ``ceil(V/(d*TP))*d*TP`` at the end
(Megatron-LM's ``vocab_size_with_padding``; pad rows are in no box);
experts in contiguous EP blocks, split by ETP inside, replicated over EDP; routers, router bias and norms
replicated over the stage; shared experts split by dense TP; MLA q_a/kv_a replicated (TE spec;
the key ``mla_down_proj=column`` gives the local spec's column split), q_b/kv_b column, o row; MTP layers on
the stage holding them (the last unless a ``pp_layout`` puts ``m`` elsewhere); tied embeddings: stage 0 and,
when PP > 1, a copy on the last stage (two replica holders). Pipeline splits: ``layout/pipeline.py``.
GLM-4.5's q/k/v biases: ``linear_qkv.bias`` rows as the weight's; gpt-oss is refused (Bridge transposes and
de-interleaves its stacked experts). fp8 ``scale_inv`` tensors (which a bf16 trainer does not store) follow their weight at 128-block
granularity (see ``shard_rules.scale_template``).
"""

from __future__ import annotations

from math import lcm

import numpy as np

from reshardctl.errors import LayoutError
from reshardctl.layout.megatron_params import megatron_local_params, megatron_qkv_runs
from reshardctl.layout.parallel_spec import ParallelSpec
from reshardctl.layout.pipeline import megatron_chunks
from reshardctl.layout.placement import LocalParam, Placement, ShardTemplate
from reshardctl.layout.shard_rules import (
    Interner, StagedPlacements, ceil_div, frac, need_divides, replicated_template, split_template,
)
from reshardctl.layout.side import SideLayout
from reshardctl.models.architectures import EXPERT_KINDS, QKV_BIAS_KINDS
from reshardctl.models.spec import ModelSpec, TensorSpec

LEGACY_VOCAB_DIVISOR = 128  # Megatron-LM --make-vocab-size-divisible-by default (vocab_divisor=128)
MEGATRON_KEYS = frozenset({"tp", "pp", "ep", "etp", "dp", "cp", "vpp", "first_stage_layers", "last_stage_layers",
                           "vocab_divisor", "pp_layout", "embedding_in_split", "loss_in_split", "mla_down_proj",
                           "rank_order"})
DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"  # megatron-core initialize_model_parallel(order=...)'s default

REPLICATED_KINDS = frozenset({
    "final_norm", "input_norm", "post_attn_norm", "q_norm", "k_norm", "q_a_norm", "kv_a_norm",
    "router", "router_bias", "mtp_enorm", "mtp_hnorm", "mtp_head_norm",
})
ROW_SPLIT_KINDS = frozenset({"mlp_gate", "mlp_up", "shared_gate", "shared_up", "q_b", "kv_b", "mtp_eh_proj"})
COL_SPLIT_KINDS = frozenset({"o", "mlp_down", "shared_down"})
QKV_KINDS = frozenset({"q", "k", "v"})
# Qwen2's and GLM-4.5's linear_qkv bias (megatron-core add_qkv_bias: the bias of the same ColumnParallelLinear,
# its rows interleaved per query group like the weight's) and Qwen2-MoE's shared-expert gate
# (transformer/moe/shared_experts.py SharedExpertMLP: gate_weight [1, H], a plain Parameter on every rank)
REPLICATED_KINDS = REPLICATED_KINDS | {"shared_expert_gate"}


def megatron_padded_vocab(vocab: int, tp: int, divisor: int | None) -> int:
    """Megatron-LM ``vocab_size_with_padding``: ``ceil(V/(d*TP))*d*TP``; ``None``: unpadded (Bridge)."""
    if divisor is None:
        return vocab
    m = divisor * tp
    return ceil_div(vocab, m) * m


class MegatronLayout(StagedPlacements, SideLayout):
    side = "train"

    def __init__(self, model: ModelSpec, spec: ParallelSpec, world_size: int | None = None):
        self.model = model
        self.spec = spec
        self.mla_down_proj = mla_down_proj = spec.mla_down_proj or "replicated"
        self.rank_order = spec.rank_order or DEFAULT_RANK_ORDER
        d = model.dims
        problems: list[str] = []
        for key in spec.given():
            if key not in MEGATRON_KEYS:
                problems.append(f"{key} is not a Megatron option (an inference-side key)")
        TP, PP, CP, EP, VPP = spec.tp, spec.pp, spec.cp, spec.ep, spec.vpp
        ETP = spec.etp or TP
        if spec.dp is not None:
            DP = spec.dp
        elif world_size is not None and world_size % (TP * CP * PP) == 0:
            DP = world_size // (TP * CP * PP)
        elif world_size is not None:
            DP = 1
            problems.append(f"world size {world_size} is not a multiple of tp({TP}) x cp({CP}) x pp({PP}) = "
                            f"{TP * CP * PP} ({frac(world_size, TP * CP * PP)}), so dp cannot be derived")
        else:  # smallest dp that also fits the expert grid: tp*cp*dp divisible by etp*ep
            DP = lcm(TP * CP, ETP * EP) // (TP * CP) if (d.num_experts and EP > 1) else 1
        self.tp, self.pp, self.cp, self.dp, self.ep, self.etp, self.vpp = TP, PP, CP, DP, EP, ETP, VPP
        self.vocab_divisor = spec.vocab_divisor
        self.world_size = TP * CP * DP * PP
        self.stage_size = S = TP * CP * DP
        self.factors = (("tp", TP), ("cp", CP), ("dp", DP), ("pp", PP))
        if world_size is not None and spec.dp is not None and world_size != self.world_size:
            problems.append(f"world size tp({TP}) x cp({CP}) x dp({DP}) x pp({PP}) = {self.world_size} ranks, "
                            f"but {world_size} were given")
        vp = megatron_padded_vocab(d.vocab, TP, spec.vocab_divisor)
        if vp % TP:
            problems.append(f"Megatron tp={TP} does not divide the unpadded vocab_size={d.vocab} "
                            f"({frac(d.vocab, TP)}; Megatron-Bridge default should_pad_vocab=False; give "
                            f"vocab_divisor={LEGACY_VOCAB_DIVISOR} for Megatron-LM's padding)")
        self.mla = d.kv_lora_rank > 0
        self.moe = d.num_experts > 0 and bool(d.moe_layers)
        if d.arch == "gpt_oss":  # archs2
            problems.append("Megatron gpt-oss is not modelled: Megatron-Bridge converts the stacked, gate/up-interleaved "
                            "HF experts (mlp.experts.gate_up_proj [E, H, 2*I]) into per-expert linear_fc1 [gate; up] "
                            "rows, transposed and de-interleaved, which HF boxes at offsets cannot express; the "
                            "learned sinks (core_attention.softmax_offset) are not checked against megatron-core")
        self._moe_layers = frozenset(d.moe_layers)
        # --- arithmetic checks (all collected) ---
        if not self.mla:
            if mla_down_proj == "column":
                problems.append(f"mla_down_proj=column given but model {model.name} has no MLA (kv_lora_rank=0): "
                                f"its attention has no down projections")
            if need_divides(problems, TP, d.num_heads, f"Megatron tp={TP}", "num_attention_heads"):
                ng = d.num_kv_heads
                if ng % TP and TP % ng:
                    problems.append(f"Megatron tp={TP} and num_query_groups={ng}: one must divide the other "
                                    f"({ng} % {TP} = {ng % TP}, {TP} % {ng} = {TP % ng})")
                elif ((d.num_heads + 2 * ng) * d.head_dim) % TP:
                    problems.append(f"Megatron tp={TP} does not divide linear_qkv rows "
                                    f"{(d.num_heads + 2 * ng) * d.head_dim}")
        else:
            need_divides(problems, TP, d.num_heads, f"Megatron tp={TP}", "num_attention_heads")
            if mla_down_proj == "column":
                if d.q_lora_rank:
                    need_divides(problems, TP, d.q_lora_rank, f"Megatron tp={TP}", "q_lora_rank")
                need_divides(problems, TP, d.kv_lora_rank + d.qk_rope_head_dim, f"Megatron tp={TP}",
                             "kv_lora_rank+qk_rope_head_dim")
        if any(t.kind == "mlp_gate" for t in model.tensors):
            need_divides(problems, TP, d.intermediate, f"Megatron tp={TP}", "intermediate_size")
        if d.num_mtp_layers:
            need_divides(problems, TP, d.hidden, f"Megatron tp={TP}", "hidden_size (MTP eh_proj)")
        if self.moe:
            need_divides(problems, EP, d.num_experts, f"Megatron ep={EP}", "num_experts")
            need_divides(problems, ETP, d.moe_intermediate, f"Megatron etp={ETP}", "moe_intermediate_size")
            if d.num_shared_experts:
                need_divides(problems, TP, d.moe_intermediate * d.num_shared_experts, f"Megatron tp={TP}",
                             "shared expert intermediate size")
            if self.world_size % (ETP * EP * PP):
                problems.append(f"expert grid etp({ETP}) x ep({EP}) x pp({PP}) = {ETP * EP * PP} does not divide "
                                f"world size {self.world_size} ({frac(self.world_size, ETP * EP * PP)})")
        elif EP > 1 or spec.etp not in (None, TP):
            problems.append(f"Megatron ep={EP}/etp={ETP} given but model {model.name} has no routed experts")
        self.edp = max(1, self.world_size // (ETP * EP * PP))
        if self.rank_order != DEFAULT_RANK_ORDER and PP > 1 and ETP * EP != TP * CP:
            # megatron-core builds the expert grid for dense models too (etp = tp, ep = 1): cp > 1 is refused there
            dense = "" if self.moe else ", which megatron-core builds for a dense model too (etp=tp, ep=1)"
            problems.append(f"rank_order={self.rank_order} with pp={PP}: megatron-core needs the expert grid's data "
                            f"parallel size to equal the dense one{dense} (parallel_state.py "
                            f"initialize_model_parallel: \"When not using pp-last rank ordering, the data parallel "
                            f"size of the attention and moe layers must be the same\"): etp x ep must equal tp x cp, "
                            f"but etp({ETP}) x ep({EP}) = {ETP * EP} and tp({TP}) x cp({CP}) = {TP * CP} "
                            f"(edp={self.edp}, dp={DP})")
        self.experts_per_rank = d.num_experts // EP if d.num_experts and EP else 0
        # --- pipeline (layout/pipeline.py: Megatron's get_num_layers_to_build / layer offset rules) ---
        L = d.num_layers
        pipe = megatron_chunks(L, PP, VPP, first=spec.first_stage_layers, last=spec.last_stage_layers,
                               embed_in_split=bool(spec.embedding_in_split), loss_in_split=bool(spec.loss_in_split),
                               layout=spec.pp_layout, num_mtp=d.num_mtp_layers, problems=problems)
        self.vpp = VPP = len(pipe.chunks[0])
        if not problems:
            for r, row in enumerate(pipe.chunks):
                if not any(row):
                    problems.append(f"pp={PP} with {L} layers leaves pp rank {r} without layers "
                                    f"({[sum(len(c) for c in rw) for rw in pipe.chunks]})")
                    break
        if problems:
            raise LayoutError(problems, hint=f"model {model.name}; train layout {self.describe()}")
        self.chunks = pipe.chunks
        self._layer_pos: dict[int, tuple[int, int, int]] = {}
        for r, row in enumerate(pipe.chunks):
            for c, layers in enumerate(row):
                for i, g in enumerate(layers):
                    self._layer_pos[g] = (r, c, i)
        for k in range(d.num_mtp_layers):
            self._layer_pos[L + k] = (*pipe.mtp_stage, k)
        self._layer_stage = {g: p[0] for g, p in self._layer_pos.items()}
        self._templates = Interner()
        self._placements = Interner()
        self._stage_ranks = tuple(tuple(self.rank_of(p, s) for s in range(S)) for p in range(PP))
        self._tied_pp = d.tie_embeddings and PP > 1
        self._stage_index: dict[int, list[int]] | None = None
        self._by_index: list[Placement | None] = [None] * len(model.tensors)

    # ------------------------------------------------------------------ public
    def describe(self) -> str:
        s = f"megatron tp={self.tp},pp={self.pp},dp={self.dp}"
        if self.cp > 1:
            s += f",cp={self.cp}"
        if self.moe or self.ep > 1:
            s += f",ep={self.ep},etp={self.etp},edp={self.edp}"
        if self.vpp > 1:
            s += f",vpp={self.vpp}"
        s += f",vocab_divisor={self.vocab_divisor or 'none'}"
        for key in ("first_stage_layers", "last_stage_layers", "embedding_in_split", "loss_in_split", "pp_layout",
                    "mla_down_proj", "rank_order"):
            v = getattr(self.spec, key)
            if v is not None:
                s += f",{key}={str(v).lower() if isinstance(v, bool) else v}"
        return s

    def framework_rules(self) -> str:
        """Which framework rules (and versions) this layout models, for ``layout show``."""
        vocab = ("unpadded (Megatron-Bridge should_pad_vocab=False)" if self.vocab_divisor is None else
                 f"padded to a multiple of {self.vocab_divisor}*tp (Megatron-LM vocab_size_with_padding)")
        return ("Megatron-Core (Megatron-LM main 2026-08; Megatron-Bridge vocab default): TE spec (or "
                "--megatron-spec local), linear_qkv per query group, fc1 stride 2, TEGroupedMLP experts in "
                "contiguous EP blocks, MTP as mtp.layers.{k}.mtp_model_layer, pipeline by get_num_layers_to_build / "
                f"get_transformer_layer_offset / PipelineParallelLayerLayout; vocab {vocab}"
                + (f"; MLA down projections {self.mla_down_proj} ("
                   + ("TE spec TELinear duplicated" if self.mla_down_proj == "replicated" else
                      "local spec ColumnParallelLinear") + ")" if self.mla else "")
                + f"; ranks in order {self.rank_order}"
                + (" (Megatron-Bridge use_tp_pp_dp_mapping=True)" if self.rank_order != DEFAULT_RANK_ORDER else ""))

    def layer_position(self, layer: int) -> tuple[int, int, int]:
        """``(pp rank, vpp chunk, local index)`` of a global layer (MTP: index within the MTP block)."""
        return self._layer_pos[layer]

    def rank_of(self, stage: int, slot: int) -> int:
        """The rank of stage-local slot ``slot`` (``tp + TP*(cp + CP*dp)``) of pipeline stage ``stage``, in the
        layout's ``rank_order`` (module docstring)."""
        if self.rank_order == DEFAULT_RANK_ORDER:
            return stage * self.stage_size + slot
        block = self.tp * self.cp
        return slot % block + block * (stage + self.pp * (slot // block))

    def stage_slot(self, rank: int) -> tuple[int, int]:
        """``(pipeline stage, stage-local slot)`` of a rank: the inverse of ``rank_of``."""
        if self.rank_order == DEFAULT_RANK_ORDER:
            return divmod(rank, self.stage_size)
        block = self.tp * self.cp
        rest, inner = divmod(rank, block)
        dp, stage = divmod(rest, self.pp)
        return stage, inner + block * dp

    def coords(self, rank: int) -> dict[str, int]:
        """Dense and expert grid coordinates of a rank."""
        TP, CP, ETP, EP = self.tp, self.cp, self.etp, self.ep
        p, s = self.stage_slot(rank)
        return {"pp": p, "tp": s % TP, "cp": (s // TP) % CP, "dp": s // (TP * CP),
                "etp": s % ETP, "ep": (s // ETP) % EP, "edp": s // (ETP * EP)}

    def padded_vocab(self) -> int:
        return megatron_padded_vocab(self.model.dims.vocab, self.tp, self.vocab_divisor)

    def _placement_keys(self):
        """``_tensor_placement``'s key (kind, shape, stage, expert block, no layer), numbered."""
        m = self.model
        expert = m.expert_array
        has_expert = bool((expert >= 0).any())
        if has_expert and not self.experts_per_rank:
            return None
        block = np.where(expert >= 0, expert // max(1, self.experts_per_rank), -1) + 1
        return self._combined(m.kind_codes, m.shape_codes, self.stage_array(), block, m.layer_array < 0)

    def _tensor_placement(self, t: TensorSpec, stage: int) -> Placement:
        kind = t.kind
        block = t.expert // self.experts_per_rank if t.expert is not None else -1
        key = (kind, t.shape, stage, block, t.layer is None)
        p = self._placements._d.get(key)
        if p is None:
            p = self._placements.get(key, lambda: self._build_placement(kind, t.shape, stage, block, t.layer))
        return p

    def local_params(self, rank: int, spec: str = "te") -> list[LocalParam]:
        """Parameters of ``rank`` as megatron-core names them with the ``"te"`` (Transformer Engine) or
        ``"local"`` layer spec (layout/megatron_params.py)."""
        return megatron_local_params(self, rank, spec)

    # ------------------------------------------------------------------ internals
    def stage_tensor_indices(self, stage: int) -> list[int]:
        if self._stage_index is None:
            idx: dict[int, list[int]] = {p: [] for p in range(self.pp)}
            rank_stage = [0] * self.world_size
            for p, ranks in enumerate(self._stage_ranks):
                for r in ranks:
                    rank_stage[r] = p
            stages_of: dict[int, list[int]] = {}  # placements are interned (and kept by _by_index): once each
            for i in range(len(self.model.tensors)):
                pl = self.placement(i)
                stages = stages_of.get(id(pl))
                if stages is None:
                    stages = stages_of[id(pl)] = sorted({rank_stage[r] for r in pl.ranks})
                for p in stages:
                    idx[p].append(i)
            self._stage_index = idx
        return self._stage_index[stage]

    def _build_placement(self, kind: str, shape: tuple[int, ...], stage: int, block: int, layer) -> Placement:
        tmpl = self._templates.get((kind, shape, block), lambda: self._build_template(kind, shape, block))
        ranks = self._stage_ranks[stage]
        if kind == "embed" and layer is None and self._tied_pp:
            # tied embeddings: stage 0 holds embedding.word_embeddings, the last stage output_layer (a copy)
            tmpl = self._templates.get(("tied", shape), lambda: ShardTemplate(shape, tmpl.holdings * 2))
            ranks = ranks + self._stage_ranks[-1]
        return Placement(tmpl, ranks)

    def _tp_index(self) -> list[int]:
        return [s % self.tp for s in range(self.stage_size)]

    def _build_template(self, kind: str, shape: tuple[int, ...], block: int) -> ShardTemplate:
        S, TP = self.stage_size, self.tp
        d = self.model.dims
        if kind in REPLICATED_KINDS or (kind in ("q_a", "kv_a") and self.mla_down_proj == "replicated"):
            return replicated_template(shape, S)
        if kind in ("embed", "lm_head"):
            vp = megatron_padded_vocab(shape[0], TP, self.vocab_divisor)
            return split_template(shape, 0, TP, self._tp_index(), per=vp // TP, limit=shape[0])
        if kind in QKV_BIAS_KINDS and not self.mla:  # 1-D rows of linear_qkv.bias, interleaved per query group as the weight's
            per_rank = []
            for r in range(TP):
                runs = megatron_qkv_runs(d.num_heads, d.num_kv_heads, d.head_dim, TP, r)
                per_rank.append(tuple(((a, b),) for (n, a, b, _) in runs if n == QKV_BIAS_KINDS[kind]))
            return ShardTemplate(shape, tuple(per_rank[s % TP] for s in range(S)))
        if kind in QKV_KINDS and not self.mla:
            per_rank = []
            for r in range(TP):
                runs = megatron_qkv_runs(d.num_heads, d.num_kv_heads, d.head_dim, TP, r)
                per_rank.append(tuple(((a, b), (0, shape[1])) for (n, a, b, _) in runs if n == kind))
            return ShardTemplate(shape, tuple(per_rank[s % TP] for s in range(S)))
        if kind in ROW_SPLIT_KINDS or kind in ("q_a", "kv_a") or (kind == "q" and self.mla):
            return split_template(shape, 0, TP, self._tp_index())
        if kind in COL_SPLIT_KINDS:
            return split_template(shape, 1, TP, self._tp_index())
        if kind in EXPERT_KINDS:
            ETP, EP = self.etp, self.ep
            idx = [s % ETP if (s // ETP) % EP == block else None for s in range(S)]
            return split_template(shape, 1 if kind == "expert_down" else 0, ETP, idx)
        return replicated_template(shape, S)  # unknown kinds: replicated over the stage
