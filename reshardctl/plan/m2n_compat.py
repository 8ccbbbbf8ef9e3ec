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
from reshardctl.topology import Topology, infer_global

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


def _fans(units) -> dict[int, tuple[int, int]]:
    """tensor index -> (max fan-in, max fan-out) over its routed transfers."""
    out: dict[int, tuple[int, int]] = {}
    for u in units:
        src = u.table.src.astype(np.int64)
        dst = u.table.dst.astype(np.int64)
        if src.size:
            pairs = np.unique(src * (1 << 32) + dst)
            s, d = pairs >> 32, pairs & ((1 << 32) - 1)
            fin = int(np.unique(d, return_counts=True)[1].max())
            fout = int(np.unique(s, return_counts=True)[1].max())
        else:
            fin = fout = 0
        for t in u.tensors.tolist():
            a, b = out.get(t, (0, 0))
            out[t] = (max(a, fin), max(b, fout))
    return out


def fan_units(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology) -> list:
    """One routed instance (no relays) per group of tensors with the same placements, standing for
    every tensor of the group: the planner rotates source replicas from instance to instance, which
    changes which replica feeds a destination, not how many distinct ranks do."""
    from reshardctl.plan.model import Unit
    from reshardctl.plan.pairs import intersect_templates
    from reshardctl.plan.reshard import group_tensors
    from reshardctl.plan.routing import route

    units = []
    pair_cache: dict = {}
    T = topology.train_world
    for gi, (sp, dp, members) in enumerate(group_tensors(model, train, infer, None)):
        key = (id(sp.template), id(dp.template))
        pieces = pair_cache.get(key)
        if pieces is None:
            pieces = pair_cache[key] = intersect_templates(sp.template, dp.template, model.tensors[members[0]].name)
        table = route(pieces, np.asarray(sp.ranks, np.int32), infer_global(np.asarray(dp.ranks, np.int32), T), topology,
                      model.tensors[members[0]].itemsize, rotation=gi, relay=False)
        units.append(Unit(np.asarray(members, dtype=np.int32), table, 1, model.tensors[members[0]].itemsize))
    return units


def check(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology, units=None) -> list[TensorCompat]:
    """Per-tensor results. ``units``: reshard units routed without relays (``fan_units`` when None)."""
    if units is None:
        units = fan_units(model, train, infer, topology)
    fans = _fans(units)
    tcache: dict = {}
    icache: dict = {}
    out = []
    order = list(REASONS)
    memo: dict = {}  # tensors with the same placements, rank and fans share one verdict
    keep = []  # placements stay referenced, so their ids are stable
    for i, t in enumerate(model.tensors):
        sp, ip = train.placement(i), infer.placement(i)
        fin, fout = fans.get(i, (0, 0))
        meshes = tuple(None if m is None else (id(m[0]), tuple(map(id, m[1])))
                       for m in (layout_mesh(train, i), layout_mesh(infer, i)))
        key = (id(sp), id(ip), meshes, len(t.shape), fin, fout)
        got = memo.get(key)
        if got is None:
            keep.append((sp, ip))
            r1, v1 = _side_checks(train, i, "train", tcache)
            r2, v2 = _side_checks(infer, i, "infer", icache)
            reasons = r1 + r2
            if len(t.shape) > LIMITS["tensor_rank"]:
                reasons.append("tensor_rank")
            if fin > LIMITS["fan_in"]:
                reasons.append("fan_in")
            if fout > LIMITS["fan_out"]:
                reasons.append("fan_out")
            vals = {**v1, **v2, "tensor_rank": len(t.shape), "fan_in": fin, "fan_out": fout}
            got = memo[key] = (tuple(sorted(set(reasons), key=order.index)), vals)
        out.append(TensorCompat(t.name, t.nbytes, got[0], got[1]))
    return out


def summarize(results: list[TensorCompat]) -> dict:
    """JSON-ready summary: totals, and incompatible tensors grouped by reason."""
    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    reasons: dict[str, dict] = {}
    for r in bad:
        for key in r.reasons:
            g = reasons.setdefault(key, {"description": REASONS[key], "tensors": 0, "bytes": 0, "examples": []})
            g["tensors"] += 1
            g["bytes"] += r.nbytes
            if len(g["examples"]) < EXAMPLES:
                g["examples"].append(r.name)
            vkey = {"fan_in": "fan_in", "fan_out": "fan_out", "tensor_rank": "tensor_rank",
                    "train_mesh_ndim": "train_mesh_ndim", "infer_mesh_ndim": "infer_mesh_ndim"}.get(key)
            if vkey:
                g["max"] = max(g.get("max", 0), int(r.values.get(vkey, 0)))
    fan_in = max((r.values.get("fan_in", 0) for r in results), default=0)
    fan_out = max((r.values.get("fan_out", 0) for r in results), default=0)
    sources = sorted({r.values.get(f"{s}_mesh_source") for r in results for s in ("train", "infer")} - {None})
    return {
        "limits": dict(LIMITS),
        "tensors": len(results),
        "compatible_tensors": len(ok),
        "compatible_bytes": sum(r.nbytes for r in ok),
        "incompatible_tensors": len(bad),
        "incompatible_bytes": sum(r.nbytes for r in bad),
        "max_fan_in": int(fan_in),
        "max_fan_out": int(fan_out),
        "mesh_source": sources,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1]["tensors"])),
    }


def m2n_compat(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology, units=None) -> dict:
    return summarize(check(model, train, infer, topology, units))


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
           "summarize", "summary_line"]
