"""Inference expert maps: which EP rank holds which routed expert, at which local slot.

vLLM (``vllm/model_executor/layers/fused_moe/layer.py``):

* ``determine_expert_map``: ``base, rem = divmod(E_phys, ep)``, the first ``rem`` ranks hold one more;
  ``linear``: rank j holds ``[j*base + min(j, rem), ...)``; ``round_robin``: experts ``j, j+ep, j+2ep, ...``.
* ``determine_expert_placement_strategy``: ``round_robin`` is kept only when the model has grouped routing
  (``num_expert_group > 1``), no redundant experts, no EPLB, and either no all2all kernels
  (``FusedMoEParallelConfig.use_all2all_kernels``: EP with in-engine DP > 1) or a backend with round-robin
  routing tables (per vLLM version, ``vllm_versions.py``: DeepEP low-latency; from 0.20 on also
  ``nixl_ep``); otherwise vLLM falls back to ``linear`` (with a warning).
* EPLB (``FusedMoE.__init__``): ``global_num_experts = E + num_redundant_experts`` physical slots, which
  must divide evenly over the EP ranks; slot -> logical expert starts as
  ``EplbState.build_initial_global_physical_to_logical_map`` (``[0..E) + [i % E for i < R]``) and is
  rebalanced at run time, so a live map can be given as a file.

SGLang (``python/sglang/srt/layers/moe``): contiguous blocks of ``E // ep`` (must divide).

An ``ExpertMap`` is per MoE layer (EPLB maps may differ per layer): ``holders(layer, e)`` is the tuple of
``(ep_rank, local_slot)`` pairs that hold logical expert ``e``. One rank may hold an expert in several
slots (the initial map wraps when R > E; a rebalanced map may do it too): the plan sends it to the rank
once, the layout's ``local_params`` lists every slot (the first the primary, the others copies of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from reshardctl.bounded_load import LoadError, load_file
from reshardctl.layout.shard_rules import frac

MAX_MAP_BYTES = 64 << 20  # an expert_map= file (EPLB physical -> logical ids)


@dataclass(frozen=True)
class ExpertMap:
    ep: int
    num_experts: int
    strategy: str  # what is in effect: linear | round_robin | eplb | contiguous
    # per MoE layer (a single entry shared by all layers when the map does not vary): physical slot -> expert
    physical: dict[int, tuple[int, ...]]

    def _phys(self, layer: int) -> tuple[int, ...]:
        return self.physical.get(layer, self.physical.get(-1, ()))

    def slots_per_rank(self, layer: int) -> list[list[int]]:
        """Per EP rank, the logical experts at its local slots 0, 1, ... (cached per distinct map)."""
        cache = self.__dict__.setdefault("_slots", {})
        key = layer if layer in self.physical else -1
        got = cache.get(key)
        if got is None:
            got = cache[key] = self._slots_per_rank(layer)
        return got

    def _slots_per_rank(self, layer: int) -> list[list[int]]:
        phys = self._phys(layer)
        if self.strategy == "round_robin":
            return [list(range(j, self.num_experts, self.ep)) for j in range(self.ep)]
        base, rem = divmod(len(phys), self.ep)
        out, start = [], 0
        for j in range(self.ep):
            n = base + (1 if j < rem else 0)
            out.append(list(phys[start:start + n]))
            start += n
        return out

    def holders(self, layer: int, expert: int) -> tuple[tuple[int, int], ...]:
        cache = self.__dict__.setdefault("_holders", {})
        key = layer if layer in self.physical else -1
        table = cache.get(key)
        if table is None:
            table = {}
            for j, experts in enumerate(self.slots_per_rank(layer)):
                for k, e in enumerate(experts):
                    table.setdefault(e, []).append((j, k))
            table = {e: tuple(v) for e, v in table.items()}
            cache[key] = table
        return table.get(expert, ())

    def local_count(self, layer: int, ep_rank: int) -> int:
        return len(self.slots_per_rank(layer)[ep_rank])


def vllm_expert_ranges(num_experts: int, ep: int) -> list[tuple[int, int]]:
    """Linear EP placement: ``[start, end)`` per EP rank, the first ``E % ep`` ranks one more."""
    base, rem = divmod(num_experts, ep)
    return [(j * base + min(j, rem), (j + 1) * base + min(j + 1, rem)) for j in range(ep)]


def effective_strategy(asked: str, *, num_expert_group: int, redundant: int, all2all_kernels: bool,
                       all2all: str, round_robin_backends: frozenset[str]) -> tuple[str, str]:
    """``(strategy, why)`` after vLLM's ``determine_expert_placement_strategy`` fallbacks
    (``round_robin_backends``: the version's backends with round-robin routing tables)."""
    if asked != "round_robin":
        return "linear", ""
    if num_expert_group <= 1 or redundant:
        return "linear", ("round_robin needs grouped routing (n_group > 1) and no redundant experts; "
                          "vLLM falls back to linear")
    if all2all_kernels and all2all not in round_robin_backends:
        return "linear", (f"round_robin with all2all kernels needs all2all="
                          f"{' or '.join(sorted(round_robin_backends))} (all2all={all2all}); vLLM falls back to linear")
    return "round_robin", ""


def load_expert_map_file(path: str, num_experts: int, num_phys: int, moe_layers: tuple[int, ...],
                         problems: list[str]) -> dict[int, tuple[int, ...]] | None:
    """A JSON physical->logical map: one list of ``E + R`` logical ids, or one such list per MoE layer
    (``{"<layer>": [...]}`` or a list of lists in MoE-layer order)."""
    try:
        doc = load_file(path, "json", max_bytes=MAX_MAP_BYTES)  # a regular file, bounded (a FIFO never hangs)
    except LoadError as e:
        problems.append(f"expert_map={path}: no such file" if e.missing else f"expert_map={path}: not readable JSON ({e})")
        return None
    if isinstance(doc, dict):
        doc = doc.get("physical_to_logical", doc)
    maps: dict[int, list] = {}
    if isinstance(doc, list) and doc and all(isinstance(x, int) for x in doc):
        maps[-1] = doc
    elif isinstance(doc, list) and all(isinstance(x, list) for x in doc):
        if len(doc) != len(moe_layers):
            problems.append(f"expert_map={path}: {len(doc)} per-layer maps, the model has {len(moe_layers)} "
                            f"MoE layers")
            return None
        maps = dict(zip(moe_layers, doc))
    elif isinstance(doc, dict):
        try:
            maps = {int(k): v for k, v in doc.items()}
        except ValueError:
            problems.append(f"expert_map={path}: keys must be MoE layer indices")
            return None
        missing = sorted(set(moe_layers) - set(maps))
        if missing:
            problems.append(f"expert_map={path}: no map for MoE layer(s) {missing[:5]}")
            return None
    else:
        problems.append(f"expert_map={path}: expected a list of logical expert ids (one per physical slot)")
        return None
    out: dict[int, tuple[int, ...]] = {}
    for layer, m in maps.items():
        where = f"expert_map={path}" + (f" layer {layer}" if layer >= 0 else "")
        if not isinstance(m, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in m):
            problems.append(f"{where}: expected a list of integers")
            continue
        if len(m) != num_phys:
            problems.append(f"{where}: {len(m)} entries, but E + redundant = {num_phys} physical slots")
            continue
        bad = [x for x in m if not 0 <= x < num_experts]
        if bad:
            problems.append(f"{where}: logical expert ids {bad[:5]} outside [0, {num_experts})")
            continue
        absent = sorted(set(range(num_experts)) - set(m))
        if absent:
            problems.append(f"{where}: logical experts {absent[:5]} have no physical slot")
            continue
        out[layer] = tuple(m)
    return out if not problems else None


def build_vllm_expert_map(*, num_experts: int, ep: int, strategy: str, redundant: int, map_file: str | None,
                          moe_layers: tuple[int, ...], problems: list[str]) -> ExpertMap:
    """The vLLM expert map for one engine's EP group of size ``ep`` (strategy already resolved)."""
    if redundant or map_file:
        num_phys = num_experts + redundant
        if num_phys % ep:
            problems.append(f"vLLM EPLB: E + redundant = {num_experts} + {redundant} = {num_phys} physical experts "
                            f"must divide evenly over ep={ep} ranks ({frac(num_phys, ep)})")
        phys: dict[int, tuple[int, ...]] = {
            -1: tuple(range(num_experts)) + tuple(i % num_experts for i in range(redundant))}
        if map_file:
            got = load_expert_map_file(map_file, num_experts, num_phys, moe_layers, problems)
            if got is not None:
                phys = got
        return ExpertMap(ep, num_experts, "eplb", phys)
    if num_experts < ep:
        problems.append(f"vLLM expert parallel over ep={ep} ranks needs num_experts >= {ep} (has {num_experts})")
    return ExpertMap(ep, num_experts, strategy, {-1: tuple(range(num_experts))})


def contiguous_expert_map(num_experts: int, ep: int, problems: list[str], what: str) -> ExpertMap:
    """SGLang: ``E // ep`` contiguous experts per EP rank (must divide)."""
    if num_experts % ep:
        problems.append(f"{what} ep={ep} does not divide num_experts={num_experts} ({frac(num_experts, ep)})")
    return ExpertMap(ep, num_experts, "contiguous", {-1: tuple(range(num_experts))})
