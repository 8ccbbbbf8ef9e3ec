"""Would NVIDIA ``nccl.m2n.reshard`` accept these layouts? A per-tensor compatibility report.

Documented limits checked, per HF tensor, on both sides (``LIMITS``):

* ``mesh_ndim``: the tensor's device mesh has at most 2 dims;
* ``contiguous``: the side ranks holding the tensor form one contiguous block ``[a, b]``;
* ``tensor_rank``: the tensor has at most 3 dims;
* ``partial``: no ``Partial`` placement (partial sums cannot be byte-copied);
* ``fan_in``: at most 16 distinct source ranks feed one destination shard;
* ``fan_out``: at most 64 distinct destination ranks are fed by one source shard.

Where the numbers come from:

* mesh: a layout exposing its DTensor mesh per tensor (a ``DTensorLayout`` built from rules: the
  first matching rule's ``mesh``, as the layout itself resolves it) gives ``mesh.ndim`` and its
  placements (``Partial`` detected there). Otherwise the dimensionality is *inferred from the
  placement*: one mesh dim per tensor dim along which some slot holds less than the full extent,
  plus one if some slots are replicas of each other (identical holdings: DP copies, replicated
  norms). Megatron ``tp x dp`` on a column-parallel weight is thus 2-D, a replicated norm 1-D,
  a tensor split along two dims with replicas 3-D. Pipeline parallelism adds no dim (each stage's
  tensors live on that stage's ranks only). Layouts without a mesh cannot express ``Partial``.
* fan-in / fan-out: from the M2N transfers the planner routes for the reshard transport without
  relays (the plan's units when it has no relays, else ``fan_units``: one routed instance per group
  of tensors with the same placements): fan-in = distinct source ranks per destination rank and
  tensor, fan-out = distinct destination ranks per source rank and tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reshardctl.layout.placement import Placement
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.distinct import distinct
from reshardctl.topology import Topology

LIMITS = {"mesh_ndim": 2, "tensor_rank": 3, "fan_in": 16, "fan_out": 64}
EXAMPLES = 3


@dataclass(frozen=True)
class TensorCompat:
    name: str
    nbytes: int
    reasons: tuple[str, ...]  # reason keys (see ``REASONS``); empty: compatible
    values: dict = field(default_factory=dict, compare=False)  # measured numbers

    @property
    def ok(self) -> bool:
        return not self.reasons


REASONS = {
    "train_mesh_ndim": "trainer mesh has more than 2 dims",
    "infer_mesh_ndim": "inference mesh has more than 2 dims",
    "train_not_contiguous": "trainer ranks holding the tensor are not a contiguous block",
    "infer_not_contiguous": "inference ranks holding the tensor are not a contiguous block",
    "tensor_rank": "tensor has more than 3 dims",
    "train_partial": "trainer placement has Partial",
    "infer_partial": "inference placement has Partial",
    "fan_in": "more than 16 source ranks feed one destination shard",
    "fan_out": "one source shard feeds more than 64 destination ranks",
}


def layout_mesh(layout: SideLayout, index: int):
    """``(mesh, placements)`` of tensor ``index`` when the layout exposes them, else ``None``."""
    getter = getattr(layout, "mesh_for", None)
    if callable(getter):
        return getter(index)
    rules = getattr(layout, "rules", None)
    if rules is None:
        return None
    t = layout.model.tensors[index]
    cache = layout.__dict__.setdefault("_m2n_matchers", [(r, r.matcher()) for r in rules])
    rule = next((r for r, m in cache if m(t.name)), getattr(layout, "default", None))
    if rule is None:
        return None
    # a tensor listed explicitly in a layout file overrides its rule: use the rule's mesh only when
    # the rule really produced this tensor's placement
    same = layout.__dict__.setdefault("_m2n_same", {})
    key = (id(rule), tuple(t.shape), layout.placement(index))
    if key not in same:
        try:
            same[key] = rule.placement_for(t.shape, t.name) == layout.placement(index)
        except Exception:  # noqa: BLE001 - a rule that cannot place this shape did not place it
            same[key] = False
    if not same[key]:
        return None
    return rule.mesh, tuple(rule.placements)


def inferred_mesh_ndim(p: Placement) -> int:
    """Mesh dims implied by a placement: split tensor dims + 1 if any slots are replicas."""
    tpl = p.template
    shape = tpl.shape
    split = set()
    for h in tpl.holdings:
        for box in h:
            for d, (a, b) in enumerate(box):
                if b - a < shape[d]:
                    split.add(d)
    replicated = any(len(c) > 1 for c in tpl.replica_classes())
    return max(1, len(split) + (1 if replicated else 0))


def holder_ranks(p: Placement) -> list[int]:
    return sorted({r for r, h in p.items() if h})


def is_contiguous(ranks: list[int]) -> bool:
    return not ranks or ranks[-1] - ranks[0] + 1 == len(ranks)


def _side_checks(layout: SideLayout, index: int, side: str, cache: dict) -> tuple[list[str], dict]:
    p = layout.placement(index)
    mp = layout_mesh(layout, index)
    key = (id(p.template), p.ranks, None if mp is None else id(mp[0]))
    got = cache.get(key)
    if got is None:
        reasons, vals = [], {}
        if mp is not None:
            mesh, placements = mp
            ndim, src = int(mesh.ndim), "mesh"
            if any(type(x).__name__ == "Partial" for x in placements):
                reasons.append(f"{side}_partial")
        else:
            ndim, src = inferred_mesh_ndim(p), "inferred"
        vals[f"{side}_mesh_ndim"] = ndim
        vals[f"{side}_mesh_source"] = src
        if ndim > LIMITS["mesh_ndim"]:
            reasons.append(f"{side}_mesh_ndim")
        ranks = holder_ranks(p)
        if not is_contiguous(ranks):
            reasons.append(f"{side}_not_contiguous")
            vals[f"{side}_ranks"] = ranks[:16]
        got = cache[key] = (reasons, vals)
    return list(got[0]), dict(got[1])


def _fans(units, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tensor: (max fan-in, max fan-out) over its routed transfers (0 for tensors in no unit)."""
    fan_in = np.zeros(n, dtype=np.int64)
    fan_out = np.zeros(n, dtype=np.int64)
    for u in units:
        if not len(u.table):
            continue
        pairs = distinct(u.table.src.astype(np.int64) * (1 << 32) + u.table.dst).values
        np.maximum.at(fan_in, u.tensors, np.bincount(pairs & ((1 << 32) - 1)).max())  # distinct sources per destination
        np.maximum.at(fan_out, u.tensors, np.bincount(pairs >> 32).max())
    return fan_in, fan_out


def fan_units(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology) -> list:
    """One routed instance (no relays) per group of tensors with the same placements, standing for
    every tensor of the group: the planner rotates source replicas from instance to instance, which
    changes which replica feeds a destination, not how many distinct ranks do."""
    from reshardctl.plan.refit_plan import Unit
    from reshardctl.plan.reshard import route_requests, routing_requests

    requests = routing_requests(model, train, infer, topology, rotate_replicas=False)
    tables = route_requests(requests, topology, relay=False)
    return [Unit(req[0], table, 1, req[1]) for req, table in zip(requests, tables)]


def _mesh_codes(layout: SideLayout, n: int, keep: list) -> np.ndarray:
    """Per tensor, a number standing for its ``layout_mesh`` (mesh and placement objects; 0: none)."""
    if not callable(getattr(layout, "mesh_for", None)) and getattr(layout, "rules", None) is None:
        return np.zeros(n, dtype=np.int64)  # no mesh for any tensor
    codes: dict[tuple, int] = {}
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        m = layout_mesh(layout, i)
        if m is not None:
            keep.append(m)  # the objects stay referenced, so their ids are stable
            out[i] = codes.setdefault((id(m[0]), tuple(map(id, m[1]))), len(codes) + 1)
    return out


def verdicts(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology,
             units=None) -> tuple[np.ndarray, list[tuple[tuple[str, ...], dict]]]:
    """Per tensor its group, and per group its (reasons, values), groups numbered in model order of their
    first tensor. Tensors with the same placements (template and ranks), meshes, tensor rank and fans
    share one verdict, judged once. ``units``: reshard units routed without relays (``fan_units`` when
    None)."""
    if units is None:
        units = fan_units(model, train, infer, topology)
    n = len(model.tensors)
    fan_in, fan_out = _fans(units, n)
    keep: list = []
    ndim = np.fromiter((len(t.shape) for t in model.tensors), dtype=np.int64, count=n)
    cols = (train.placement_classes()[0], infer.placement_classes()[0], _mesh_codes(train, n, keep),
            _mesh_codes(infer, n, keep), ndim, fan_in, fan_out)
    order = np.lexsort(cols[::-1])  # stable: members ascending within a run of equal keys
    new = np.ones(n, dtype=bool)  # a tensor whose key differs from the one before it, in key order
    if n > 1:
        new[1:] = np.any([c[order][1:] != c[order][:-1] for c in cols], axis=0)
    run = np.cumsum(new) - 1  # run number, in key order
    first = order[new]  # first (lowest) tensor of every run
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # runs in model order of their first tensor
    group = np.empty(n, dtype=np.int64)
    group[order] = rank[run]
    tcache: dict = {}
    icache: dict = {}
    reason_order = list(REASONS)
    out: list[tuple[tuple[str, ...], dict]] = []
    for i in np.sort(first).tolist():
        r1, v1 = _side_checks(train, i, "train", tcache)
        r2, v2 = _side_checks(infer, i, "infer", icache)
        reasons = r1 + r2
        rank_i, fin, fout = int(ndim[i]), int(fan_in[i]), int(fan_out[i])
        if rank_i > LIMITS["tensor_rank"]:
            reasons.append("tensor_rank")
        if fin > LIMITS["fan_in"]:
            reasons.append("fan_in")
        if fout > LIMITS["fan_out"]:
            reasons.append("fan_out")
        vals = {**v1, **v2, "tensor_rank": rank_i, "fan_in": fin, "fan_out": fout}
        out.append((tuple(sorted(set(reasons), key=reason_order.index)), vals))
    return group, out


def check(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology, units=None) -> list[TensorCompat]:
    """Per-tensor results. ``units``: reshard units routed without relays (``fan_units`` when None)."""
    group, judged = verdicts(model, train, infer, topology, units)
    return [TensorCompat(t.name, t.nbytes, *judged[g]) for t, g in zip(model.tensors, group.tolist())]


def summarize(model: ModelSpec, group: np.ndarray, judged: list[tuple[tuple[str, ...], dict]]) -> dict:
    """JSON-ready summary of ``verdicts``: totals, and incompatible tensors grouped by reason (reasons in
    order of their first tensor, then by tensor count; examples: the first tensors in model order)."""
    nbytes = model.nbytes_array
    count = np.bincount(group, minlength=len(judged))
    size = np.bincount(group, weights=nbytes, minlength=len(judged))  # exact: integers far below 2**53
    bad = np.asarray([bool(r) for r, _ in judged], dtype=bool)
    reasons: dict[str, dict] = {}
    members: dict[str, list[int]] = {}
    vkeys = ("fan_in", "fan_out", "tensor_rank", "train_mesh_ndim", "infer_mesh_ndim")
    for gi, (keys, vals) in enumerate(judged):
        for key in keys:
            g = reasons.setdefault(key, {"description": REASONS[key], "tensors": 0, "bytes": 0, "examples": []})
            members.setdefault(key, []).append(gi)
            g["tensors"] += int(count[gi])
            g["bytes"] += int(size[gi])
            if key in vkeys:
                g["max"] = max(g.get("max", 0), int(vals.get(key, 0)))
    for key, g in reasons.items():
        first = np.nonzero(np.isin(group, members[key]))[0][:EXAMPLES]
        g["examples"] = [model.tensors[i].name for i in first.tolist()]
    sources = sorted({v.get(f"{s}_mesh_source") for _, v in judged for s in ("train", "infer")} - {None})
    return {
        "limits": dict(LIMITS),
        "tensors": len(model.tensors),
        "compatible_tensors": int(count[~bad].sum()),
        "compatible_bytes": int(size[~bad].sum()),
        "incompatible_tensors": int(count[bad].sum()),
        "incompatible_bytes": int(size[bad].sum()),
        "max_fan_in": max((v.get("fan_in", 0) for _, v in judged), default=0),
        "max_fan_out": max((v.get("fan_out", 0) for _, v in judged), default=0),
        "mesh_source": sources,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1]["tensors"])),
    }


def m2n_compat(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology, units=None) -> dict:
    return summarize(model, *verdicts(model, train, infer, topology, units))


def summary_line(s: dict) -> str:
    """One human line: ``NCCL m2n.reshard: 35/37 tensors (98.1% of bytes) compatible; 2 not: ...``."""
    total_b = s["compatible_bytes"] + s["incompatible_bytes"]
    pct = 100.0 * s["compatible_bytes"] / total_b if total_b else 100.0
    line = (f"NCCL m2n.reshard: {s['compatible_tensors']}/{s['tensors']} tensors ({pct:.1f}% of bytes) compatible"
            f" (max fan-in {s['max_fan_in']}, max fan-out {s['max_fan_out']})")
    if s["incompatible_tensors"]:
        parts = [f"{v['tensors']} {v['description']} (e.g. {v['examples'][0]})" for v in s["reasons"].values()]
        line += f"; {s['incompatible_tensors']} not: " + "; ".join(parts)
    return line


__all__ = ["LIMITS", "REASONS", "TensorCompat", "check", "inferred_mesh_ndim", "layout_mesh", "m2n_compat",
           "summarize", "summary_line", "verdicts"]
