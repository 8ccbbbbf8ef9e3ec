"""SGLang inference layout: who holds which box of every HF tensor on an SGLang server.

Rules (``sgl-project/sglang``, ``python/sglang/srt``):

* Ranks (``distributed/parallel_state.py::initialize_model_parallel``): one engine's world is
  ``tp * pp`` with ``rank = tp_rank + TP*pp_rank``; without DP attention, ``dp=N`` runs N independent
  replicas (the DP controller), laid out here as ``rank = tp + TP*(pp + PP*replica)``.
* DP attention (``layers/dp_attention.py::compute_dp_attention_world_info``): ``--enable-dp-attention``
  keeps ``tp`` as the world and splits it into ``dp`` attention groups: ``attn_tp = tp // dp``,
  ``attn_tp_rank = tp_rank % attn_tp`` (attention weights split over ``attn_tp``, replicated over the dp
  groups); the input embedding is built with ``enable_tp=not is_dp_attention_enabled()`` (replicated);
  the lm_head, dense MLPs and shared experts stay split over the full ``tp`` (defaults
  ``enable_dp_lm_head=False``, ``moe_dense_tp_size=None``, no DeepEP).
* MoE (``initialize_model_parallel``): ``moe_tp = tp // ep``; the EP group of ``tp_rank`` is
  ``{j, j + moe_tp, ...}``, so ``moe_ep_rank = tp_rank // moe_tp`` and ``moe_tp_rank = tp_rank % moe_tp``;
  each EP rank holds ``E // ep`` contiguous experts (must divide), split by ``moe_tp`` inside the expert.
* Pipeline (``distributed/utils.py::get_pp_indices``): the LAST ``L % PP`` stages get one more layer, or
  ``SGLANG_PP_LAYER_PARTITION``.
* Tied embeddings with PP > 1 (``models/llama.py::LlamaForCausalLM.__init__``, "perform weight tying for
  PP"): the last rank's ``lm_head`` (split like any lm_head) receives a copy of the first rank's
  ``embed_tokens``, so the tied tensor has holders on the first and the last stage.
* Linear layers and vocabulary mirror vLLM (``layers/linear.py``, ``layers/vocab_parallel_embedding.py``:
  same QKV replication rule, vocab padded to 64). DeepSeek's fused down projection is
  ``fused_qkv_a_proj_with_mqa`` (replicated).

Not modelled (refused): GLM-4.5 MoE and gpt-oss, SGLang's MTP/NextN draft models, DeepEP (``ep_size`` forced to ``tp_size`` and
shared experts unsplit), block-FP8 shape checks.
"""

from __future__ import annotations

from reshardctl.layout.expert_maps import contiguous_expert_map
from reshardctl.layout.parallel_spec import ParallelSpec
from reshardctl.layout.pipeline import sglang_pp_parts
from reshardctl.layout.shard_rules import frac, need_divides
from reshardctl.layout.vllm import VllmLayout

SGLANG_KEYS = frozenset({"tp", "pp", "dp", "ep", "dp_attention", "pp_partition"})
# SGLang's qwen2.py / qwen2_moe.py / mixtral.py / glm4_moe.py / gpt_oss.py were not read against this layout
# (their shared-expert fusion and weight loaders): refused
SGLANG_UNMODELLED_ARCHS = {"qwen2": "Qwen2", "qwen2_moe": "Qwen2-MoE", "mixtral": "Mixtral", "glm4_moe": "GLM-4.5 MoE",
                           "gpt_oss": "gpt-oss"}


class SglangLayout(VllmLayout):
    framework = "SGLang"
    keys = SGLANG_KEYS
    fused_qkv_a = "fused_qkv_a_proj_with_mqa.weight"
    tied_last_name = "lm_head.weight"  # tied + pp > 1: the last rank's lm_head receives the embedding
    pp_copies: dict[str, str] = {}  # vLLM's every-stage embed/norm/lm_head copies are not modelled for SGLang

    def _configure(self, spec: ParallelSpec, world_size: int | None, problems: list[str]) -> None:
        d, TP, PP = self.model.dims, spec.tp, spec.pp
        self.dp_attention = bool(spec.dp_attention)
        if d.num_mtp_layers:
            problems.append("SGLang's MTP (NextN) draft layout is not modelled; plan without --mtp")
        if d.arch in SGLANG_UNMODELLED_ARCHS:
            problems.append(f"SGLang's {SGLANG_UNMODELLED_ARCHS[d.arch]} layout ({d.arch}) is not modelled; "
                            "serve it with vLLM (--infer-style vllm) or plan the SGLang side by hand")
        if self.dp_attention:
            self.attn_dp = spec.dp or 1
            if TP % self.attn_dp:
                problems.append(f"SGLang dp_attention: dp={self.attn_dp} must divide tp={TP} "
                                f"({frac(TP, self.attn_dp)})")
            DP = 1  # the dp attention groups live inside the tp world
        else:
            self.attn_dp = 1
            if spec.dp is not None:
                DP = spec.dp
            elif world_size is not None and world_size % (TP * PP) == 0:
                DP = world_size // (TP * PP)
            else:
                DP = 1
        self.attn_tp = max(1, TP // self.attn_dp)
        self.dp, self.dp_mode = DP, "replicas"
        self.stage_size = M = DP * TP
        self._tp_of = [j % TP for j in range(M)]
        self._attn_of = [t % self.attn_tp for t in self._tp_of]
        self.sp_moe, self.shared_tp, self.placement_note = False, TP, ""
        self.expert_map = None
        ep = spec.ep
        self.expert_parallel = ep > 1
        if not self.moe:
            self.ep, self.moe_tp, self.moe_tp_what = 1, 1, ""
            self._ep_of = self._mtp_of = [0] * M
            if ep > 1:
                problems.append(f"SGLang ep={ep} given but model {self.model.name} has no routed experts")
            return
        if TP % ep:
            problems.append(f"SGLang ep={ep} must divide tp={TP} (moe_tp = tp // ep; {frac(TP, ep)})")
            ep = 1
        self.ep, self.moe_tp = ep, TP // ep
        self.moe_tp_what = f"tp({TP}) // ep({ep})"
        self._ep_of = [t // self.moe_tp for t in self._tp_of]
        self._mtp_of = [t % self.moe_tp for t in self._tp_of]
        if ep > 1:
            self.expert_map = contiguous_expert_map(d.num_experts, ep, problems, "SGLang")

    def _check_attention(self, problems: list[str]) -> None:
        d, n = self.model.dims, self.attn_tp
        what = f"SGLang attention tp={n}" + (f" (tp {self.spec.tp} // dp {self.attn_dp})" if self.dp_attention else "")
        need_divides(problems, n, d.num_heads, what, "num_attention_heads")
        if not self.mla and d.num_kv_heads:
            nkv = d.num_kv_heads
            if n >= nkv and n % nkv:
                problems.append(f"{what} > num_kv_heads={nkv} requires {n} % {nkv} == 0 ({n} % {nkv} = {n % nkv})")
            elif n < nkv:
                need_divides(problems, n, nkv, what, "num_kv_heads")

    def _pp_parts(self, L: int, PP: int, partition, problems: list[str]) -> list[int]:
        return sglang_pp_parts(L, PP, partition, problems)

    def _check_fp8(self, problems: list[str]) -> None:
        return None  # SGLang's block-fp8 checks are not modelled (see the module docstring)

    def _attn_split(self, kind: str) -> tuple[int, list[int]]:
        return self.attn_tp, self._attn_of

    def _vocab_split(self, kind: str) -> tuple[int, list[int]] | None:
        if kind == "embed" and self.dp_attention:
            return None  # VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())
        return self.tp, self._tp_of

    def describe(self) -> str:
        s = f"sglang tp={self.tp},pp={self.pp},dp={self.attn_dp if self.dp_attention else self.dp}"
        if self.dp_attention:
            s += f",dp_attention=on(attn_tp={self.attn_tp})"
        if self.moe:
            s += f",ep={self.ep},moe_tp={self.moe_tp}"
        if self.spec.pp_partition:
            s += f",pp_partition={':'.join(map(str, self.spec.pp_partition))}"
        return s

    def framework_rules(self) -> str:
        dp = (f"DP attention: {self.attn_dp} attention groups of attn_tp={self.attn_tp} inside tp={self.tp}"
              if self.dp_attention else f"{self.dp} independent replica(s) of tp={self.tp}")
        return ("SGLang (main 2025-26: initialize_model_parallel moe_ep/moe_tp groups, "
                f"compute_dp_attention_world_info, get_pp_indices); {dp}; MoE ep={self.ep} x moe_tp={self.moe_tp}")
