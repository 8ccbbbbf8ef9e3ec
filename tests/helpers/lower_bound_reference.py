"""The lower bound's per-tensor loop (reshardctl ac90df1), kept as the reference the per-placement-class
``reshardctl.plan.lower_bound.needed_bytes`` must equal (tests/plan/test_lower_bound_classes.py)."""

from __future__ import annotations

import numpy as np

from reshardctl.plan.lower_bound import _classes_overlap, _union_numel


def reference_need(plan) -> tuple[np.ndarray, np.ndarray]:
    """(bytes each inference rank must end up with, distinct bytes per inference domain), one tensor at
    a time, placements keyed by object."""
    topo = plan.topology
    T, I = topo.train_world, topo.infer_world
    need = np.zeros(I)
    infer_dom = topo.domain_of[T:]
    domains = np.unique(infer_dom)
    dom_index = {int(d): k for k, d in enumerate(domains)}
    dom_bytes = np.zeros(len(domains))
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    counts: dict[tuple[int, int], int] = {}
    keep = []
    for i, t in enumerate(plan.model.tensors):
        p = plan.infer.placement(i)
        key = (id(p), t.itemsize)
        if key in counts:
            counts[key] += 1
            continue
        counts[key] = 1
        keep.append(p)
        tpl = p.template
        per_rank = np.zeros(I)
        per_dom = np.zeros(len(domains))
        dom_classes: dict[int, list[int]] = {}
        for c, cls in enumerate(tpl.replica_classes()):
            n = tpl.slot_numel(cls[0])
            ranks = np.asarray([p.ranks[s] for s in cls])
            np.add.at(per_rank, ranks, n)
            for d in np.unique(infer_dom[ranks]):
                per_dom[dom_index[int(d)]] += n
                dom_classes.setdefault(dom_index[int(d)], []).append(c)
        if _classes_overlap(tpl):
            classes = tpl.replica_classes()
            for k, cs in dom_classes.items():
                per_dom[k] = _union_numel([b for c in cs for b in tpl.holdings[classes[c][0]]])
        cache[key] = (per_rank, per_dom)
    for key, n in counts.items():
        per_rank, per_dom = cache[key]
        need += per_rank * key[1] * n
        dom_bytes += per_dom * key[1] * n
    return need, dom_bytes
