"""vLLM's MoE rules per release: which all2all backends it accepts, which turn on sequence-parallel MoE,
which keep round-robin expert placement. The infer key ``vllm=<version>`` picks one (default ``0.33``).

Each rule set was read from that release's own wheel (``vllm-<version>-*.whl`` from PyPI); the
``source`` strings name the file and lines in it:

* ``0.33`` (0.33.0; 0.32.0 reads the same for every rule here):
  ``vllm/config/parallel.py:45-60`` ``All2AllBackend`` (adds ``deepep_v2``, ``mori_*``, ``moonep``,
  ``nixl_ep``, ``flashinfer_nvlink_*``, ``passthrough``); ``parallel.py:537-543``
  ``_validate_parallel_config``: ``pplx`` and ``naive`` "have been removed", replaced by
  ``allgather_reducescatter`` (so they now turn sequence-parallel MoE ON, like the default);
  ``parallel.py:768-785`` ``use_sequence_parallel_moe``: allgather_reducescatter, deepep_high_throughput,
  deepep_low_latency, deepep_v2, flashinfer_nvlink_one_sided, passthrough, mori_high_throughput,
  mori_low_latency, nixl_ep (not naive, not flashinfer_nvlink_two_sided, not moonep);
  ``model_executor/layers/fused_moe/expert_map_manager.py:137-147`` ``determine_expert_placement_strategy``
  with ``fused_moe/config.py:1070-1071`` ``needs_round_robin_routing_tables``: round_robin kept with
  all2all kernels only for deepep_low_latency or nixl_ep; ``fused_moe/config.py:1035-1038``
  ``use_all2all_kernels = use_ep and (dp > 1 or pcp > 1 or sequence parallel)``. ``passthrough`` is bound
  by the MoE backend, not by ``--all2all-backend`` (``engine/arg_utils.py:1159-1161`` removes it from the
  CLI choices), but a deployment can run with it. ``moonep``: ``config/vllm.py:2106-2140`` refuses it with a
  quantized or non-bf16 model, with EPLB and with a placement other than linear; where its kernels run
  (``use_moonep_kernels``: all2all kernels in use, ``fused_moe/config.py:1102-1103``) the routed experts'
  ``w13_weight`` / ``w2_weight`` are replaced after loading by all-gathered ``[E+B]`` gate and down tensors on
  every rank, the up projection kept outside the parameters (``fused_moe/oracle/unquantized.py:424-456``,
  ``prepare_finalize/moonep.py:131-157``), and a reload raises ``NotImplementedError``
  (``oracle/unquantized.py:440-448``): no byte refit can write them, so the layout refuses it there.
* ``0.29`` (0.29.0, the vLLM of NeMo RL v0.8.0's container): ``vllm/config/parallel.py:42-55``
  ``All2AllBackend`` (0.33's list without ``moonep`` and ``passthrough``); ``parallel.py:488-494`` the same
  naive/pplx fallback to ``allgather_reducescatter``; ``parallel.py:704-719`` ``use_sequence_parallel_moe``:
  0.33's list without ``deepep_v2`` (and without ``passthrough``), so ``deepep_v2`` keeps the shared experts
  TP-split there; ``fused_moe/expert_map_manager.py:116-147`` and ``fused_moe/config.py:1060-1063``,
  ``:1095-1096`` as in 0.33 (round_robin kept with deepep_low_latency or nixl_ep).
* ``0.14`` (0.14.1; the release nearest the rules reshardctl modelled before issue 24, which were read
  from unpinned ``main``): ``vllm/config/parallel.py:40-47`` ``All2AllBackend`` (naive, pplx,
  deepep_high_throughput, deepep_low_latency, allgather_reducescatter, flashinfer_all2allv);
  ``parallel.py:429-441`` ``use_sequence_parallel_moe``: allgather_reducescatter, naive,
  deepep_high_throughput, deepep_low_latency; ``model_executor/layers/fused_moe/layer.py:200-210``
  ``determine_expert_placement_strategy``: round_robin kept with all2all kernels only for
  deepep_low_latency; ``fused_moe/config.py:863-864`` ``use_all2all_kernels = dp_size > 1 and use_ep``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reshardctl.errors import LayoutError


@dataclass(frozen=True)
class VllmRules:
    version: str
    release: str  # the wheel read
    backends: frozenset[str]  # all2all_backend values the release accepts
    replaced: dict[str, str]  # accepted but replaced by another backend at config validation
    sp_moe: frozenset[str]  # backends for which use_sequence_parallel_moe holds (with EP, tp > 1, dp > 1)
    round_robin: frozenset[str]  # backends that keep round_robin placement when all2all kernels are used
    source: str  # file:line of each rule, for layout show
    # backends whose kernels replace the routed experts' parameters after loading (no refit can write them):
    # backend -> what vLLM does, with file:line; refused where all2all kernels are in use
    replaces_experts: dict[str, str] = field(default_factory=dict)
    # backends vLLM refuses at start-up with a quantized model, EPLB or a non-linear placement: backend -> file:line
    bf16_linear_only: dict[str, str] = field(default_factory=dict)

    def effective_backend(self, asked: str) -> str:
        return self.replaced.get(asked, asked)


_SP_033 = frozenset({"allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
                     "flashinfer_nvlink_one_sided", "passthrough", "mori_high_throughput", "mori_low_latency",
                     "nixl_ep"})

_SP_029 = _SP_033 - {"deepep_v2", "passthrough"}
_MOONEP_033 = ("vLLM 0.33.0 fused_moe/oracle/unquantized.py:300-303 picks the MoonEP experts (use_moonep_kernels, "
               "fused_moe/config.py:1102-1103) and :424-456 replaces w13_weight / w2_weight after loading "
               "by all-gathered [E+B] gate and down tensors on every rank (prepare_finalize/moonep.py:131-157; the "
               "up projection outside the parameters), and :440-448 raises NotImplementedError on a weight reload")

VLLM_RULES: dict[str, VllmRules] = {
    "0.14": VllmRules(
        "0.14", "0.14.1",
        backends=frozenset({"naive", "pplx", "deepep_high_throughput", "deepep_low_latency",
                            "allgather_reducescatter", "flashinfer_all2allv"}),
        replaced={},
        sp_moe=frozenset({"allgather_reducescatter", "naive", "deepep_high_throughput", "deepep_low_latency"}),
        round_robin=frozenset({"deepep_low_latency"}),
        source="vLLM 0.14.1: config/parallel.py:40-47 All2AllBackend, :429-441 use_sequence_parallel_moe; "
               "fused_moe/layer.py:200-210 determine_expert_placement_strategy; fused_moe/config.py:863-864 "
               "use_all2all_kernels"),
    "0.29": VllmRules(
        "0.29", "0.29.0",
        backends=_SP_029 | {"naive", "pplx", "deepep_v2", "flashinfer_all2allv", "flashinfer_nvlink_two_sided"},
        replaced={"naive": "allgather_reducescatter", "pplx": "allgather_reducescatter"},
        sp_moe=_SP_029,
        round_robin=frozenset({"deepep_low_latency", "nixl_ep"}),
        source="vLLM 0.29.0: config/parallel.py:42-55 All2AllBackend, :488-494 naive/pplx -> "
               "allgather_reducescatter, :704-719 use_sequence_parallel_moe; fused_moe/expert_map_manager.py:"
               "116-147 determine_expert_placement_strategy, fused_moe/config.py:1095-1096 "
               "needs_round_robin_routing_tables, :1060-1063 use_all2all_kernels"),
    "0.33": VllmRules(
        "0.33", "0.33.0",
        backends=_SP_033 | {"naive", "pplx", "moonep", "flashinfer_all2allv", "flashinfer_nvlink_two_sided"},
        replaced={"naive": "allgather_reducescatter", "pplx": "allgather_reducescatter"},
        sp_moe=_SP_033,
        round_robin=frozenset({"deepep_low_latency", "nixl_ep"}),
        source="vLLM 0.33.0: config/parallel.py:45-60 All2AllBackend, :537-543 naive/pplx -> "
               "allgather_reducescatter, :768-785 use_sequence_parallel_moe; fused_moe/expert_map_manager.py:"
               "137-147 determine_expert_placement_strategy, fused_moe/config.py:1070-1071 "
               "needs_round_robin_routing_tables, :1035-1038 use_all2all_kernels",
        replaces_experts={"moonep": _MOONEP_033},
        bf16_linear_only={"moonep": "config/vllm.py:2106-2140"}),
}
DEFAULT_VLLM = "0.33"


def backend_problems(rules: VllmRules, backend: str, *, all2all_kernels: bool, eplb: bool, placement: str,
                     quantized: bool) -> list[str]:
    """What vLLM ``rules.release`` refuses, or what no byte refit can write, for the (effective) all2all
    ``backend`` of a deployment: the start-up refusals of ``bf16_linear_only`` backends, and a backend whose
    kernels replace the routed experts' parameters after loading, where all2all kernels are in use
    (``FusedMoEParallelConfig.use_all2all_kernels``: EP with in-engine DP > 1 or sequence parallel)."""
    out: list[str] = []
    where = rules.bf16_linear_only.get(backend)
    if where:
        for bad, what in ((quantized, "a quantized checkpoint (unquantized bf16 only)"),
                          (eplb, "EPLB (redundant / expert_map)"), (placement != "linear", f"placement={placement}")):
            if bad:
                out.append(f"all2all={backend}: vLLM {rules.release} refuses {what} with this backend ({where})")
    why = rules.replaces_experts.get(backend)
    if why and all2all_kernels:
        out.append(f"all2all={backend} with expert parallel and in-engine DP > 1 (its all2all kernels run): {why}; "
                   f"a refit cannot write the experts there (separate engines, dp_mode=engines, do not use them)")
    return out


def vllm_rules(version: str | None) -> VllmRules:
    """The rule set of ``vllm=<version>`` (``0.33``, ``0.33.0``, ``0.33.1`` all name ``0.33``); None: the
    default. An unknown version is a ``LayoutError`` listing the known ones."""
    if version is None:
        return VLLM_RULES[DEFAULT_VLLM]
    parts = version.strip().lower().removeprefix("v").split(".")
    key = ".".join(parts[:2])
    rules = VLLM_RULES.get(key)
    if rules is None or len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise LayoutError(f"--infer vllm={version}: no rules for this vLLM version (known: "
                          f"{', '.join(VLLM_RULES)}; default {DEFAULT_VLLM})")
    return rules
