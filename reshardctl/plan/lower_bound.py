"""The physical lower bound of a refit, transport-independent (docs/cost-model.md, "Lower bound").

The largest of:
* every inference GPU's bytes over its ingress (NVLink + NIC of that GPU, at their nominal figures);
* every inference NVLink domain's distinct bytes over the NICs of its inference nodes (when no
  trainer rank shares the domain);
* the model's bytes over the trainer nodes' NICs (when no inference rank shares a trainer domain);
* on ``cpu_only`` sites (every rank a process on one machine): all bytes the inference ranks hold over
  the host's copy bandwidth.
Nominal figures (``Links.peak_*``), no latency, no copies, no checksums: nothing can beat it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.distinct import distinct
from reshardctl.plan.refit_plan import Plan
from reshardctl.plan.pairs import owners_overlap


def _classes_overlap(tpl) -> bool:
    """Do two replica classes of a template (slots with different holdings) share an element?"""
    classes = tpl.replica_classes()
    boxes = [(c, b) for c, cls in enumerate(classes) for b in tpl.holdings[cls[0]]]
    if len(classes) < 2 or len(boxes) < 2:
        return False
    owner = np.asarray([c for c, _ in boxes])
    arr = np.asarray([b for _, b in boxes], dtype=np.int64)  # [n, ndim, 2]
    return owners_overlap(arr[:, :, 0], arr[:, :, 1], owner)


def _union_numel(boxes) -> int:
    """Elements covered by (possibly overlapping) boxes: a coordinate-compressed coverage grid."""
    ndim = len(boxes[0])
    cuts = [np.asarray(sorted({x for b in boxes for x in b[d]}), dtype=np.int64) for d in range(ndim)]
    grid = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for b in boxes:
        grid[tuple(slice(int(np.searchsorted(cuts[d], b[d][0])), int(np.searchsorted(cuts[d], b[d][1]))) for d in range(ndim))] = True
    cell = np.ones(grid.shape, dtype=np.int64)
    for d in range(ndim):
        cell = cell * np.diff(cuts[d]).reshape([-1 if j == d else 1 for j in range(ndim)])
    return int(cell[grid].sum())


@dataclass(frozen=True)
class LowerBound:
    seconds: float
    reason: str  # which resource binds


def needed_bytes(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(bytes each inference rank must end up with, distinct bytes each inference NVLink domain needs, in
    ascending domain order), from the placement classes (template and ranks: what the bytes depend on) and
    itemsizes of the tensors. Every figure is an integer far below 2**53: the sums are exact in any order."""
    topo = plan.topology
    T, I = topo.train_world, topo.infer_world
    model = plan.model
    need = np.zeros(I)
    infer_dom = topo.domain_of[T:]
    domains = distinct(infer_dom).values
    dom_index = {int(d): k for k, d in enumerate(domains)}
    dom_bytes = np.zeros(len(domains))
    classes, reps = plan.infer.placement_classes()
    tensors_of = np.bincount(classes * 16 + model.itemsizes) if len(classes) else np.zeros(0, np.int64)  # itemsize <= 8
    for key in np.flatnonzero(tensors_of).tolist():
        c, itemsize = divmod(key, 16)
        p = reps[c]
        tpl = p.template
        per_rank = np.zeros(I)
        per_dom = np.zeros(len(domains))
        dom_classes: dict[int, list[int]] = {}
        for k, cls in enumerate(tpl.replica_classes()):
            n = tpl.slot_numel(cls[0])
            ranks = np.asarray([p.ranks[s] for s in cls])
            np.add.at(per_rank, ranks, n)
            for d in distinct(infer_dom[ranks]).values:
                per_dom[dom_index[int(d)]] += n
                dom_classes.setdefault(dom_index[int(d)], []).append(k)
        if _classes_overlap(tpl):  # count each element once per domain, not once per class
            replica_classes = tpl.replica_classes()
            for k, cs in dom_classes.items():
                per_dom[k] = _union_numel([b for c in cs for b in tpl.holdings[replica_classes[c][0]]])
        need += per_rank * itemsize * int(tensors_of[key])
        dom_bytes += per_dom * itemsize * int(tensors_of[key])
    return need, dom_bytes


def lower_bound(plan: Plan, links) -> LowerBound:
    """Transport-independent: bytes that must cross the most loaded GPU ingress / domain NICs."""
    topo = plan.topology
    T, I = topo.train_world, topo.infer_world
    model = plan.model
    infer_dom = topo.domain_of[T:]
    domains = distinct(infer_dom).values
    need, dom_bytes = needed_bytes(plan)
    cands: list[tuple[float, str]] = []
    shares_domain = bool(set(topo.domain_of[:T].tolist()) & set(infer_dom.tolist()))
    has_nvlink_peer = topo.gpus_per_node > 1 or topo.nodes_per_domain > 1
    ingress = links.peak_nic + (links.peak_nvlink if has_nvlink_peer else 0.0)
    g = int(np.argmax(need)) if I else 0
    cands.append((need[g] / ingress, f"inference rank {g} must receive {int(need[g])} bytes over NVLink+NIC"))
    if not shares_domain:
        for k, d in enumerate(domains):
            nodes = distinct(topo.node_of[T:][infer_dom == d]).values.size
            cands.append((dom_bytes[k] / (nodes * links.peak_node_nic), f"NVLink domain {int(d)} must take in {int(dom_bytes[k])} distinct bytes over the NICs of {nodes} node(s)"))
        cands.append((model.num_bytes / (topo.train_nodes * links.peak_node_nic), f"{model.num_bytes} model bytes must leave {topo.train_nodes} trainer node(s) over their NICs"))
    if links.host:
        cands.append((need.sum() / links.peak_host, f"{int(need.sum())} bytes must be copied into the inference processes through one host's memory"))
    secs, reason = max(cands)
    return LowerBound(float(secs), reason)
