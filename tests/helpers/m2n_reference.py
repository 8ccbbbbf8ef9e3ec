"""The straightforward per-tensor NCCL m2n compatibility check and summary (reshardctl 5aa7c63), kept as
the reference the grouped ``reshardctl.plan.m2n_compat`` must equal (tests/plan/test_m2n_vectorised.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from reshardctl.plan.m2n_compat import (
    EXAMPLES, LIMITS, REASONS, TensorCompat, _side_checks, fan_units, layout_mesh,
)

if TYPE_CHECKING:
    from reshardctl.layout.side import SideLayout
    from reshardctl.models.spec import ModelSpec
    from reshardctl.topology import Topology


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


def reference_check(model: ModelSpec, train: SideLayout, infer: SideLayout, topology: Topology, units=None) -> list[TensorCompat]:
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


def reference_summarize(results: list[TensorCompat]) -> dict:
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


