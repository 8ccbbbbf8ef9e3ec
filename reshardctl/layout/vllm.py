"""vLLM inference layout: who holds which box of every HF tensor.

Sources (``vllm-project/vllm``): ``vllm/model_executor/layers/linear.py``,
``vllm/model_executor/layers/vocab_parallel_embedding.py``, ``vllm/model_executor/layers/fused_moe/``
(``layer.py``: ``determine_expert_map``; ``config.py``: ``FusedMoEParallelConfig.make``),
``vllm/distributed/utils.py`` (``get_pp_indices``); each rule below names its class or function.

Ranks: ``rank = tp + TP*(pp + PP*dp)`` (``arange(world).reshape(DP, PP, TP)``, TP innermost). Templates are
over the ``DP*TP`` ranks of one pipeline stage, slot ``j = dp*TP + tp``; every DP replica is a full copy of
the non-expert weights (replica slots). Two data-parallel deployments (``dp_mode``):

* ``engines`` (the default unless ``ep > tp``): each DP replica is its own engine, as NeMo RL, verl and
  slime run generation: the MoE world is one engine's TP ranks; with EP, EP = TP inside each engine (EP rank
  = ``j % TP``), every replica the same map; without, every expert TP-split over ``tp``.
* ``in_engine`` (the default when ``ep > tp``: NeMo RL's ``vllm_dp_size = ep // tp``, ``VLLM_DP_SIZE``):
  engines of ``k = ep // tp`` in-engine DP ranks (``dp / k`` of them; without ``ep``, one engine of all ``dp``);
  the fused-MoE world of an engine is flattened over its DP x TP (``FusedMoEParallelConfig.make``): expert
  parallel over its ``k*tp`` ranks (EP rank = ``j % (k*TP)``), or, without EP, every expert TP-sharded over
  them. With in-engine DP > 1, EP, TP > 1 and a sequence-parallel all2all backend of the vLLM version
  (``vllm_versions.py``), ``ParallelConfig.use_sequence_parallel_moe`` holds and DeepSeek's shared experts
  are built with ``disable_tp=True`` (``DeepseekV2MoE`` -> ``DeepseekV2MLP``): replicated.

``vllm=<version>`` picks the rule set (``vllm_versions.VLLM_RULES``: accepted backends, SP-MoE backends,
round-robin placement). Pipeline copies: architectures in ``VLLM_PP_COPIES`` (Qwen3-MoE) build
``embed_tokens``, the final norm and ``lm_head`` on every stage; with PP > 1 those tensors are placed on
every stage (the same split on each), so a refit sends them the new weights.

Rules: ``qkv_proj = [q_r | k_(r//rep) | v_(r//rep)]`` (``QKVParallelLinear``, ``rep = TP/nkv``); merged
gate_up ``[gate_r; up_r]``; row-parallel o/down; vocab padded to ``ceil(V/64)*64`` split by TP, real rows
only in boxes; expert maps in ``expert_maps.py`` (linear, round_robin, EPLB); MLA q_a/kv_a replicated in
``fused_qkv_a_proj``; router, bias, norms and MTP ``eh_proj`` replicated. Tied embeddings with PP > 1: the
last stage builds ``embed_tokens`` too and ties ``lm_head`` to it (``LlamaModel.__init__``: first rank, or
tied and last rank), so the embedding has holders on the first and the last stage. Pipeline:
``pipeline.vllm_pp_parts`` (``get_pp_indices``, ``VLLM_PP_LAYER_PARTITION``); MTP layers go to the last
stage (the draft model ``DeepSeekMTP`` runs there next to the lm_head). Block-FP8 views are checked with
``fp8_rules.check_vllm_fp8``. fp8 ``scale_inv`` follows its weight (``shard_rules.scale_template``).

``local_params`` (the names, local shapes and offsets of vLLM's parameters on a rank): ``layout/vllm_params.py``.

GLM-4.5 MoE (``glm4_moe.py``, ``glm4_moe_mtp.py``) and gpt-oss (``gpt_oss.py``, BF16 weights): docs/layouts.md,
"GLM-4.5 MoE and gpt-oss" (q/k/v biases in ``qkv_proj.bias``, GLM's fp32 gate and always-TP shared experts,
gpt-oss's stacked experts and sinks; gpt-oss ``local_params`` refused, its parameters being transposed).
"""

from __future__ import annotations

import numpy as np

from reshardctl.errors import LayoutError
from reshardctl.layout.expert_maps import ExpertMap, build_vllm_expert_map, effective_strategy, vllm_expert_ranges
from reshardctl.layout.fp8_rules import check_vllm_fp8
from reshardctl.layout.parallel_spec import ParallelSpec
from reshardctl.layout.pipeline import vllm_pp_parts
from reshardctl.layout.placement import LocalParam, Placement, ShardTemplate
from reshardctl.layout.shard_rules import (
    Interner, StagedPlacements, ceil_div, frac, need_divides, replicated_template, split_template,
)
from reshardctl.layout.side import SideLayout
from reshardctl.layout.vllm_params import vllm_local_params, vllm_param_names
from reshardctl.layout.vllm_versions import DEFAULT_VLLM, backend_problems, vllm_rules
from reshardctl.models.architectures import EXPERT_KINDS, QKV_BIAS_KINDS
from reshardctl.models.spec import ModelSpec, TensorSpec

__all__ = ["VllmLayout", "vllm_expert_ranges", "vllm_padded_vocab"]

VOCAB_PAD = 64
VLLM_KEYS = frozenset({"tp", "pp", "dp", "ep", "expert_parallel", "pp_partition", "dp_mode", "placement", "all2all",
                       "redundant", "expert_map", "vllm"})

REPLICATED_KINDS = frozenset({
    "final_norm", "input_norm", "post_attn_norm", "q_norm", "k_norm", "q_a_norm", "kv_a_norm", "router",
    "router_bias", "mtp_enorm", "mtp_hnorm", "mtp_head_norm", "mtp_eh_proj", "q_a", "kv_a",
})
ATTN_ROW_KINDS = frozenset({"q_b", "kv_b", "q"})
DENSE_ROW_KINDS = frozenset({"mlp_gate", "mlp_up"})
SHARED_KINDS = frozenset({"shared_gate", "shared_up", "shared_down"})
# engineer "archs1" (vllm/model_executor/models/qwen2.py, qwen2_moe.py, mixtral.py): Qwen2 / Qwen2-MoE
# qkv_proj = QKVParallelLinear(bias=True), its bias split like the weight's rows; Qwen2-MoE
# Qwen2MoeSparseMoeBlock.shared_expert = Qwen2MoeMLP (MergedColumnParallelLinear gate_up_proj + RowParallelLinear
# down_proj: TP-split, no disable_tp, so also under use_sequence_parallel_moe) and shared_expert_gate =
# torch.nn.Linear(H, 1) (replicated). Their parameter names: layout/vllm_params.py.
REPLICATED_KINDS = REPLICATED_KINDS | {"shared_expert_gate"}
# archs2 (GLM-4.5 MoE, gpt-oss): o_proj bias (RowParallelLinear) and router bias replicated. GLM-4.5: glm4_moe.py
# Glm4MoE.__init__ builds the shared experts as Glm4MoeMLP without disable_tp (TP-split even under
# sequence-parallel MoE) and the router as nn.Linear(dtype=torch.float32) (its fp32 dtype: layout/vllm_params.py)
SHARED_ALWAYS_TP = frozenset({"qwen2_moe", "glm4_moe"})  # shared expert TP-split whatever the MoE parallelism
# gpt-oss experts stored stacked (GptOssExperts); gpt_oss.py GptOssModel._load_weights_other slices them
STACKED_KINDS = frozenset({"stacked_gate_up", "stacked_gate_up_bias", "stacked_down", "stacked_down_bias"})
# Architectures (ARCHS keys) whose vLLM model builds embed_tokens, the final norm and lm_head on EVERY pipeline
# stage (no PPMissingLayer for them): those copies are loaded from the checkpoint at start-up, so a refit must
# send them the new weights too. Value: where vLLM builds them (file:line, vLLM 0.33.0).
VLLM_PP_COPIES: dict[str, str] = {
    "qwen3_moe": "qwen3_moe.py:468 embed_tokens, :479 norm (Qwen3MoeModel.__init__), :580 lm_head "
                 "(Qwen3MoeForCausalLM.__init__); 0.14.1 the same at :406, :417, :662",
    "qwen2_moe": "qwen2_moe.py:372 embed_tokens, :388 norm (Qwen2MoeModel.__init__), :462 lm_head "
                 "(Qwen2MoeForCausalLM.__init__)",
    "mixtral": "mixtral.py:316 embed_tokens, :336 norm (MixtralModel.__init__), :406 lm_head "
               "(MixtralForCausalLM.__init__)",
}


def vllm_padded_vocab(vocab: int) -> int:
    return ceil_div(vocab, VOCAB_PAD) * VOCAB_PAD


class VllmLayout(StagedPlacements, SideLayout):
    side = "infer"
    framework = "vLLM"
    keys = VLLM_KEYS
    fused_qkv_a = "fused_qkv_a_proj.weight"  # DeepSeek's replicated [q_a; kv_a] (MergedColumnParallelLinear)
    tied_last_name = "model.embed_tokens.weight"  # the last stage's own embed_tokens, lm_head tied to it
    pp_copies: dict[str, str] = VLLM_PP_COPIES

    def __init__(self, model: ModelSpec, spec: ParallelSpec, world_size: int | None = None):
        self.model, self.spec = model, spec
        d = model.dims
        problems: list[str] = []
        for key in spec.given():
            if key not in self.keys:
                problems.append(f"{key} is not a {self.framework} option")
        TP, PP = spec.tp, spec.pp
        self.mla = d.kv_lora_rank > 0
        self.moe = d.num_experts > 0 and bool(d.moe_layers)
        self._copies = PP > 1 and d.arch in self.pp_copies  # embed/norm/lm_head on every stage
        self._configure(spec, world_size, problems)  # sets dp, world, stage slots and the MoE plan
        DP, M = self.dp, self.stage_size
        self.tp, self.pp = TP, PP
        self.world_size = DP * PP * TP
        self.factors = (("tp", TP), ("pp", PP), ("dp", DP))
        if world_size is not None and world_size != self.world_size:
            problems.append(f"world size tp({TP}) x pp({PP}) x dp({DP}) = {self.world_size} ranks, "
                            f"but {world_size} were given")
        self._check_attention(problems)
        if d.arch == "gpt_oss":  # archs2
            self._check_gpt_oss(problems)
        vp = vllm_padded_vocab(d.vocab)
        if vp % TP:
            problems.append(f"{self.framework} tp={TP} does not divide the padded vocab {vp} = ceil({d.vocab}/64)*64 "
                            f"({frac(vp, TP)})")
        if any(t.kind == "mlp_gate" for t in model.tensors):
            need_divides(problems, TP, d.intermediate, f"{self.framework} tp={TP}", "intermediate_size")
        if self.moe:
            if d.num_shared_experts and self.shared_tp > 1:
                need_divides(problems, self.shared_tp, d.moe_intermediate * d.num_shared_experts,
                             f"{self.framework} tp={self.shared_tp}", "shared expert intermediate size")
            if self.moe_tp > 1:
                need_divides(problems, self.moe_tp, d.moe_intermediate, f"{self.framework} MoE tensor parallel "
                             f"{self.moe_tp_what} = {self.moe_tp}", "moe_intermediate_size")
        L = d.num_layers
        if PP > L:
            problems.append(f"{self.framework} pp={PP} > {L} layers")
        self.pp_parts = self._pp_parts(L, PP, spec.pp_partition, problems)
        if not problems:
            self._check_fp8(problems)
        if problems:
            raise LayoutError(problems, hint=f"model {model.name}; infer layout {self.describe()}")
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
        self._tied_pp = d.tie_embeddings and PP > 1
        self._templates = Interner()
        self._placements = Interner()
        self._by_index: list[Placement | None] = [None] * len(model.tensors)
        assert M == DP * TP

    # ------------------------------------------------------------------ configuration (per framework)
    def _configure(self, spec: ParallelSpec, world_size: int | None, problems: list[str]) -> None:
        d, TP, PP = self.model.dims, spec.tp, spec.pp
        try:
            self.version_rules = vllm_rules(spec.vllm)
        except LayoutError as e:
            problems.extend(e.violations)
            self.version_rules = vllm_rules(None)
        ep_on = spec.expert_parallel if spec.expert_parallel is not None else (
            spec.ep > 1 or bool(spec.redundant) or spec.expert_map is not None)
        if spec.dp is not None:
            DP = spec.dp
        elif world_size is not None and world_size % (TP * PP) == 0:
            DP = world_size // (TP * PP)
        elif spec.ep > TP and spec.ep % TP == 0 and spec.dp_mode != "engines":
            DP = spec.ep // TP
        else:
            DP = 1
        # NeMo RL (nemo_rl/models/generation/vllm/vllm_generation.py, VllmGeneration.__init__): vLLM DP inside
        # an engine only when ep > tp (vllm_dp_size = ep // tp, VLLM_DP_SIZE); otherwise one engine per replica
        mode = spec.dp_mode or ("in_engine" if spec.ep > TP else "engines")
        engine_dp = 1
        if mode == "in_engine":
            engine_dp = DP if spec.ep <= 1 else spec.ep // TP
            if spec.ep > 1 and spec.ep % TP:
                problems.append(f"vLLM ep={spec.ep} with in-engine DP must be a multiple of tp={TP} (vLLM's EP = "
                                f"DP x TP of one engine; {spec.ep} % {TP} = {spec.ep % TP})")
                engine_dp = 1
            elif engine_dp and DP % engine_dp:
                problems.append(f"vLLM ep={spec.ep} = tp({TP}) x {engine_dp} in-engine DP ranks, which does not "
                                f"divide dp={DP} into engines ({frac(DP, engine_dp)} engines)")
                engine_dp = 1
            elif spec.dp_mode and 1 < spec.ep == TP and DP > 1:
                problems.append(f"vLLM dp_mode=in_engine with ep=tp={TP}: each engine would hold one DP rank (that "
                                f"is dp_mode=engines); in-engine DP needs ep = k x tp with k > 1 dividing dp={DP}")
        elif spec.ep > 1 and spec.ep != TP:
            problems.append(f"vLLM ep={spec.ep} must be tp({TP}) = {TP} (dp_mode=engines: {DP} separate engines, "
                            f"EP = TP inside each) or k x tp({TP}) with k > 1 dividing dp({DP}) (dp_mode=in_engine: "
                            f"vLLM's DP+EP over the flattened DP x TP ranks of each engine)")
        engine_dp = max(1, engine_dp)
        self.dp, self.dp_mode, self.expert_parallel = DP, mode, ep_on
        self.engine_dp, self.engines = engine_dp, DP // engine_dp
        self.stage_size = M = DP * TP
        group = TP * engine_dp  # the fused-MoE world of one engine (its dp x tp ranks of a stage)
        if spec.ep > 1 and spec.expert_parallel is False:
            problems.append(f"ep={spec.ep} contradicts expert_parallel=false")
        rules = self.version_rules
        asked = spec.all2all or "allgather_reducescatter"
        if asked not in rules.backends:
            problems.append(f"all2all={asked!r} is not a backend of vLLM {rules.version} (expected one of "
                            f"{', '.join(sorted(rules.backends))}; {rules.source.split(':', 1)[0]} All2AllBackend)")
        all2all = rules.effective_backend(asked)
        self.all2all = all2all
        self.sp_moe = bool(ep_on and TP > 1 and engine_dp > 1 and all2all in rules.sp_moe)
        if asked in rules.backends:  # FusedMoEParallelConfig.use_all2all_kernels: EP and in-engine dp > 1
            quantized = any(t.name.endswith("weight_scale_inv") for t in self.model.tensors)
            problems.extend(backend_problems(
                rules, all2all, all2all_kernels=bool(ep_on and engine_dp > 1), quantized=quantized,
                eplb=bool(spec.redundant or spec.expert_map), placement=spec.placement or "linear"))
        self.shared_tp = 1 if self.sp_moe and d.arch not in SHARED_ALWAYS_TP else TP
        self._tp_of = [j % TP for j in range(M)]
        self.expert_map: ExpertMap | None = None
        self.placement_note = ""
        if not self.moe:
            self.moe_tp, self.moe_tp_what, self.ep = 1, "", 1
            self._ep_of = self._mtp_of = [0] * M
            if spec.ep > 1 or spec.redundant or spec.expert_map or spec.placement:
                problems.append(f"vLLM expert options given but model {self.model.name} has no routed experts")
            return
        if ep_on:
            self.ep, self.moe_tp, self.moe_tp_what = group, 1, ""
            self._ep_of = [j % group for j in range(M)]
            self._mtp_of = [0] * M
            strategy, self.placement_note = effective_strategy(
                spec.placement or "linear", num_expert_group=int(self.model.config.get("n_group") or 1),
                redundant=spec.redundant or 0, all2all_kernels=engine_dp > 1, all2all=all2all,
                round_robin_backends=rules.round_robin)
            self.expert_map = build_vllm_expert_map(
                num_experts=d.num_experts, ep=group, strategy=strategy, redundant=spec.redundant or 0,
                map_file=spec.expert_map, moe_layers=tuple(d.moe_layers), problems=problems)
        else:
            if spec.redundant or spec.expert_map or spec.placement:
                problems.append("vLLM expert placement / EPLB options need expert parallel (ep=N)")
            self.ep = 1
            self.moe_tp = group
            self.moe_tp_what = f"dp({engine_dp}) x tp({TP})" if engine_dp > 1 else f"tp({TP}) (one engine)"
            self._ep_of = [0] * M
            self._mtp_of = [j % group for j in range(M)]
            if d.arch == "qwen3_moe" and TP > d.num_experts:
                problems.append(f"vLLM Qwen3-MoE: tp={TP} > num_experts={d.num_experts} without expert parallel")
        if d.arch == "qwen2_moe" and TP > d.num_experts:  # archs1: Qwen2MoeSparseMoeBlock raises, EP or not
            problems.append(f"vLLM Qwen2-MoE: tp={TP} > num_experts={d.num_experts} (Qwen2MoeSparseMoeBlock refuses it)")

    def _check_attention(self, problems: list[str]) -> None:
        d, TP = self.model.dims, self.spec.tp
        need_divides(problems, TP, d.num_heads, f"{self.framework} tp={TP}", "num_attention_heads")
        if not self.mla and d.num_kv_heads:
            nkv = d.num_kv_heads
            if TP >= nkv and TP % nkv:
                problems.append(f"{self.framework} tp={TP} > num_kv_heads={nkv} requires {TP} % {nkv} == 0 "
                                f"({TP} % {nkv} = {TP % nkv})")
            elif TP < nkv:
                need_divides(problems, TP, nkv, f"{self.framework} tp={TP}", "num_kv_heads")

    def _check_gpt_oss(self, problems: list[str]) -> None:
        """archs2: what ``gpt_oss.py`` (``GptOssModel._load_weights_other``, the BF16 path) can load: experts in
        contiguous EP blocks of ``E // ep`` (no other placement, no redundant experts), ``intermediate_size``
        divisible by the engine's torch.distributed world (``MLPBlock.__init__`` asserts it), one pipeline stage
        (``GptOssModel`` builds ``embedding`` / ``norm`` and ``GptOssForCausalLM`` ``lm_head`` on every pipeline
        rank: those copies are not in this layout)."""
        d, spec = self.model.dims, self.spec
        if self.framework != "vLLM":
            problems.append(f"{self.framework}: gpt-oss is not modelled for {self.framework} (only vLLM's gpt_oss.py)")
            return
        q = self.model.config.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method") is not None:
            problems.append(f"vLLM gpt-oss with quantization_config.quant_method={q.get('quant_method')!r}: vLLM loads "
                            f"MXFP4 experts (gpt_oss.py _load_weights_mxfp4) as swizzled blocks, not modelled; the "
                            f"modelled engine loads a BF16 checkpoint (a config.json without quantization_config)")
        if self.pp > 1:
            problems.append(f"vLLM gpt-oss with pp={self.pp}: GptOssModel builds embedding and norm, and "
                            f"GptOssForCausalLM lm_head, on every pipeline rank; those copies are not modelled here")
        world = self.tp * self.pp * (self.dp if self.dp_mode == "in_engine" else 1)
        need_divides(problems, world, d.moe_intermediate, f"vLLM gpt-oss engine world size {world} (MLPBlock "
                     f"asserts intermediate_size % world_size == 0)", "intermediate_size")
        if self.expert_parallel:
            need_divides(problems, self.ep, d.num_experts, f"vLLM gpt-oss ep={self.ep} (experts_per_rank = "
                         f"num_experts // ep_size)", "num_local_experts")
            if self.expert_map is not None and (self.expert_map.strategy != "linear" or spec.redundant):
                problems.append(f"vLLM gpt-oss loads experts in contiguous blocks (ep_rank * E // ep); placement="
                                f"{self.expert_map.strategy}{f', redundant={spec.redundant}' if spec.redundant else ''} "
                                f"is not what its loader does")

    def _pp_parts(self, L: int, PP: int, partition, problems: list[str]) -> list[int]:
        return vllm_pp_parts(L, PP, partition, problems)

    def _check_fp8(self, problems: list[str]) -> None:
        check_vllm_fp8(self.model, tp=self.tp, shared_tp=self.shared_tp, moe_tp=self.moe_tp, problems=problems)

    # ------------------------------------------------------------------ public
    def describe(self) -> str:
        s = f"{self.framework.lower()} tp={self.tp},pp={self.pp},dp={self.dp}"
        if self.dp > 1:
            s += f",dp_mode={self.dp_mode}"
            if self.dp_mode == "in_engine" and self.engines > 1:
                s += f",engines={self.engines}"
        if self.version_rules.version != DEFAULT_VLLM:
            s += f",vllm={self.version_rules.version}"
        if self.moe:
            s += f",expert_parallel={'on' if self.expert_parallel else 'off'}"
            if self.expert_parallel:
                s += f",ep={self.ep}"
                if self.expert_map is not None:
                    s += f",placement={self.expert_map.strategy}"
                    if self.spec.redundant:
                        s += f",redundant={self.spec.redundant}"
            if self.sp_moe:
                s += ",sp_moe=on"
        if self.spec.pp_partition:
            s += f",pp_partition={':'.join(map(str, self.spec.pp_partition))}"
        return s

    def framework_rules(self) -> str:
        """Which framework rules (and versions) this layout models, for ``layout show``."""
        if self.dp_mode == "in_engine":
            dp = (f"in-engine DP: {self.engines} engine(s) of dp={self.engine_dp} x tp={self.tp}; MoE world "
                  f"flattened over each engine's dp x tp" + (f" (EP = {self.ep})" if self.expert_parallel else ""))
        else:
            inside = (f"EP = TP = {self.tp} inside each" if self.moe and self.expert_parallel else
                      f"experts TP-split over tp={self.tp} inside each, no EP" if self.moe else "")
            dp = f"{self.dp} separate engines, one per replica" + (f" ({inside})" if inside else "")
        note = f"; {self.placement_note}" if self.placement_note else ""
        a2a = (f"; all2all={self.spec.all2all} runs as {self.all2all}"
               if self.spec.all2all and self.spec.all2all != self.all2all else "")
        return (f"vLLM {self.version_rules.version} rules ({self.version_rules.source}; QKVParallelLinear, "
                f"FusedMoEParallelConfig.make, determine_expert_map, get_pp_indices, validate_fp8_block_shape); {dp}"
                + ("; shared experts replicated (use_sequence_parallel_moe)" if self.sp_moe else "") + a2a + note
                + (f"; embed/norm/lm_head built on every pipeline stage ({self.pp_copies[self.model.dims.arch]})"
                   if self._copies else ""))

    def coords(self, rank: int) -> dict[str, int]:
        return {"dp": rank // (self.tp * self.pp), "pp": (rank // self.tp) % self.pp, "tp": rank % self.tp}

    def padded_vocab(self) -> int:
        return vllm_padded_vocab(self.model.dims.vocab)

    @property
    def expert_ranges(self) -> list[tuple[int, int]]:
        """Linear placement only: ``[start, end)`` per EP rank."""
        if self.expert_map is None or self.expert_map.strategy != "linear":
            return []
        return vllm_expert_ranges(self.model.dims.num_experts, self.ep)

    def _expert_holders(self, t: TensorSpec) -> tuple[int, ...]:
        if self.expert_map is None:
            return ()
        return tuple(sorted({j for j, _ in self.expert_map.holders(t.layer, t.expert)}))

    def _placement_keys(self):
        """``_tensor_placement``'s key (kind, shape, stage, the expert's holders, no layer: tied and copies
        follow from kind and that), numbered."""
        m = self.model
        expert, layer = m.expert_array, m.layer_array
        holders = np.zeros(len(expert), dtype=np.int64)  # 0: () (no expert, or no map)
        at = np.nonzero(expert >= 0)[0]
        if self.expert_map is not None and at.size:
            number: dict[tuple[int, ...], int] = {(): 0}
            per_map: dict[int, dict[int, int]] = {}  # a layer's map (EPLB maps may differ per layer) -> codes
            for L in np.unique(layer[at]).tolist():
                sel = at[layer[at] == L]
                codes = per_map.setdefault(L if L in self.expert_map.physical else -1, {})
                for e in np.unique(expert[sel]).tolist():
                    if e not in codes:
                        codes[e] = number.setdefault(
                            tuple(sorted({j for j, _ in self.expert_map.holders(L, e)})), len(number))
                holders[sel] = [codes[e] for e in expert[sel].tolist()]
        return self._combined(m.kind_codes, m.shape_codes, self.stage_array(), holders, layer < 0)

    def _tensor_placement(self, t: TensorSpec, stage: int) -> Placement:
        kind = t.kind
        block = self._expert_holders(t) if t.expert is not None else ()
        copies = self._copies and t.layer is None
        tied = kind == "embed" and t.layer is None and self._tied_pp and not copies
        key = (kind, t.shape, stage, block, tied, copies)
        p = self._placements._d.get(key)
        if p is None:
            def build() -> Placement:
                tmpl = self._templates.get((kind, t.shape, block), lambda: self._build_template(kind, t.shape, block))
                ranks = self._stage_ranks[stage]
                if copies:  # built on every stage (VLLM_PP_COPIES): the same split on each stage's ranks
                    tmpl = self._templates.get(("copies", kind, t.shape),
                                               lambda: ShardTemplate(t.shape, tmpl.holdings * self.pp))
                    ranks = tuple(r for rs in self._stage_ranks for r in rs)
                elif tied:  # the last stage holds the tied weight as its output head (split like lm_head)
                    head = self._templates.get(("lm_head", t.shape, ()), lambda: self._build_template("lm_head", t.shape, ()))
                    tmpl = self._templates.get(("tied", t.shape),
                                               lambda: ShardTemplate(t.shape, tmpl.holdings + head.holdings))
                    ranks = ranks + self._stage_ranks[-1]
                return Placement(tmpl, ranks)
            p = self._placements.get(key, build)
        return p

    # ------------------------------------------------------------------ internals
    def _attn_split(self, kind: str) -> tuple[int, list[int]]:
        """(tp size, per-slot tp index) for attention tensors (vLLM: the engine's TP)."""
        return self.tp, self._tp_of

    def _vocab_split(self, kind: str) -> tuple[int, list[int]] | None:
        return self.tp, self._tp_of

    def _build_template(self, kind: str, shape: tuple[int, ...], block: tuple[int, ...]) -> ShardTemplate:
        M = self.stage_size
        d = self.model.dims
        if kind in REPLICATED_KINDS:
            return replicated_template(shape, M)
        kind = QKV_BIAS_KINDS.get(kind, kind)  # archs2: a q/k/v bias splits as its weight's rows
        if kind in STACKED_KINDS:
            return self._stacked_template(kind, shape)
        if kind == "sinks":  # gpt-oss OAIAttention.sinks [num_heads // tp], loaded by narrowing heads
            n, idx = self._attn_split("q")
            return split_template(shape, 0, n, idx)
        if kind in ("embed", "lm_head"):
            split = self._vocab_split(kind)
            if split is None:
                return replicated_template(shape, M)
            n, idx = split
            return split_template(shape, 0, n, idx, per=vllm_padded_vocab(shape[0]) // n, limit=shape[0])
        if kind in QKV_BIAS_KINDS:  # archs1: the bias of qkv_proj, split as the weight's rows
            kind = QKV_BIAS_KINDS[kind]
        if kind in ("q", "k", "v", "o") and not self.mla:
            n, idx = self._attn_split(kind)
            if kind == "o":
                return split_template(shape, 1, n, idx)
            if kind == "q":
                return split_template(shape, 0, n, idx)
            kvh = max(1, d.num_kv_heads // n)
            rep = max(1, n // d.num_kv_heads)
            return split_template(shape, 0, shape[0] // (kvh * d.head_dim), [t // rep for t in idx],
                                  per=kvh * d.head_dim)
        if kind in ATTN_ROW_KINDS or kind == "o":
            n, idx = self._attn_split(kind)
            return split_template(shape, 1 if kind == "o" else 0, n, idx)
        if kind in DENSE_ROW_KINDS:
            return split_template(shape, 0, self.tp, self._tp_of)
        if kind == "mlp_down":
            return split_template(shape, 1, self.tp, self._tp_of)
        if kind in SHARED_KINDS:
            if self.shared_tp == 1:
                return replicated_template(shape, M)
            return split_template(shape, 1 if kind == "shared_down" else 0, self.tp, self._tp_of)
        if kind in EXPERT_KINDS:
            dim = 1 if kind == "expert_down" else 0
            if self.expert_map is None:
                return split_template(shape, dim, self.moe_tp, self._mtp_of)
            return split_template(shape, dim, self.moe_tp,
                                  [self._mtp_of[j] if self._ep_of[j] in block else None for j in range(M)])
        return replicated_template(shape, M)

    def _stacked_template(self, kind: str, shape: tuple[int, ...]) -> ShardTemplate:
        """archs2, gpt-oss stacked experts (``gpt_oss.py _load_weights_other``): with EP, ``weight[ep_rank_start:
        ep_rank_end]`` (dim 0); without, the fused-MoE TP rank ``r`` of ``n`` takes ``gate_up_proj[:, :, 2*r*I/n :
        2*(r+1)*I/n]`` (gate/up interleaved, so a contiguous column range), ``gate_up_proj_bias[:, 2*r*I/n : ...]``,
        ``down_proj[:, r*I/n : (r+1)*I/n, :]``, and ``down_proj_bias`` only on TP rank 0 (``weight.zero_()`` on the
        others: their copy is zero, not a replica)."""
        M = self.stage_size
        if self.expert_map is not None:
            return split_template(shape, 0, self.ep, self._ep_of)
        if kind == "stacked_down_bias":
            return split_template(shape, 0, 1, [0 if r == 0 else None for r in self._mtp_of])
        dim = {"stacked_gate_up": 2, "stacked_gate_up_bias": 1, "stacked_down": 1}[kind]
        assert M == len(self._mtp_of)
        return split_template(shape, dim, self.moe_tp, self._mtp_of)

    def param_names(self, rank: int) -> list[str]:
        """The names of vLLM's parameters on ``rank`` (``vllm_param_names``: those of ``local_params``, without
        their segments), built once per rank and layout."""
        cache = self.__dict__.setdefault("_param_names", {})
        got = cache.get(rank)
        if got is None:
            got = cache[rank] = tuple(vllm_param_names(self, rank))
        return list(got)

    def local_params(self, rank: int) -> list[LocalParam]:
        """vLLM's parameters on ``rank`` with the HF segments inside them (layout/vllm_params.py), built
        once per rank and layout (a fresh list each call: callers may change it)."""
        cache = self.__dict__.setdefault("_local_params", {})
        got = cache.get(rank)
        if got is None:
            got = cache[rank] = tuple(vllm_local_params(self, rank))
        return list(got)
