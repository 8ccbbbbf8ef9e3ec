"""The straightforward per-entry traffic accounting of ``p2p_stats`` (reshardctl 5aa7c63), kept as the
reference the vectorised ``reshardctl.plan.stats.p2p_stats`` must equal (tests/plan/test_stats_vectorised.py)."""

from __future__ import annotations

import numpy as np

from reshardctl.plan.refit_plan import Plan
from reshardctl.plan.routing import TransferTable
from reshardctl.plan.stats import (
    K, MSGS, NIC_RECV, NIC_SEND, NVL_RECV, NVL_SEND, PACK_RECV, PACK_SEND, PlanStats,
)


def link_class(table: TransferTable, plan_topology) -> np.ndarray:
    """0 intra_node, 1 intra_domain, 2 cross_domain, per transfer."""
    node, dom = plan_topology.node_of, plan_topology.domain_of
    same_node = node[table.src] == node[table.dst]
    same_dom = dom[table.src] == dom[table.dst]
    return np.where(same_node, 0, np.where(same_dom, 1, 2)).astype(np.int8)


def _contiguous(lo, hi, hold_lo, hold_hi):
    """Row by row, from the definition: a box is one contiguous byte range of its row-major holding box
    when its last element's flat offset minus its first's is its element count minus one (written
    independently of ``stats._contiguous``, which reasons about extents per dim)."""
    out = np.zeros(len(lo), dtype=bool)
    for i in range(len(lo)):
        hext = [int(b - a) for a, b in zip(hold_lo[i], hold_hi[i])]
        strides = [int(np.prod(hext[d + 1:], dtype=np.int64)) for d in range(len(hext))]
        first = sum((int(a) - int(h)) * st for a, h, st in zip(lo[i], hold_lo[i], strides))
        last = sum((int(b) - 1 - int(h)) * st for b, h, st in zip(hi[i], hold_lo[i], strides))
        out[i] = last - first + 1 == int(np.prod([int(b - a) for a, b in zip(lo[i], hi[i])], dtype=np.int64))
    return out


def _holding_boxes(p, side_world: int, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[side_world, ndim] lo/hi of every rank's box of placement ``p``; the full tensor for a rank
    holding several boxes (or none)."""
    lo = np.zeros((side_world, shape.size), dtype=np.int64)
    hi = np.broadcast_to(shape, (side_world, shape.size)).copy()
    count = np.zeros(side_world, dtype=np.int64)
    for slot, r in enumerate(p.ranks):
        boxes = p.template.holdings[slot]
        count[r] += len(boxes)
        if len(boxes) == 1:
            lo[r] = [a for a, _ in boxes[0]]
            hi[r] = [b for _, b in boxes[0]]
    many = count != 1
    lo[many] = 0
    hi[many] = shape
    return lo, hi


def zero_copy(plan: Plan, unit, cache: dict | None = None) -> tuple[np.ndarray, ...]:
    """Per transfer of a unit: (in place on the sender, in place on the receiver, message class). A
    region is in place on a side when it is a whole box there (a message of whole boxes lies back to
    back in the rank's arena, boxes in first-use order); its class (wire.py): contiguous in a box on
    both sides 0, the sender only 1, the receiver only 2, neither 3. A holding of several boxes is
    judged against the full tensor. ``cache``: per-placement boxes, shared across the units of a plan."""
    cache = {} if cache is None else cache
    table = unit.table
    t0 = int(unit.tensors[0])
    shape = np.asarray(plan.model.tensors[t0].shape, dtype=np.int64)
    T = plan.train_world
    boxes = []
    for side, layout, world in (("t", plan.train, T), ("i", plan.infer, plan.infer_world)):
        p = layout.placement(t0)
        got = cache.get((side, id(p)))
        if got is None:
            got = cache[(side, id(p))] = (p, _holding_boxes(p, world, shape))
        boxes.append(got[1])
    contig, whole = [], []
    for ranks in (table.src, table.dst):
        trainer = ranks < T
        local = np.where(trainer, ranks, ranks - T)
        hold_lo = np.where(trainer[:, None], boxes[0][0][np.minimum(local, T - 1)], boxes[1][0][np.clip(local, 0, plan.infer_world - 1)])
        hold_hi = np.where(trainer[:, None], boxes[0][1][np.minimum(local, T - 1)], boxes[1][1][np.clip(local, 0, plan.infer_world - 1)])
        contig.append(_contiguous(table.lo, table.hi, hold_lo, hold_hi))
        whole.append(((table.lo == hold_lo) & (table.hi == hold_hi)).all(axis=1))
    klass = np.where(contig[0], np.where(contig[1], 0, 1), np.where(contig[1], 2, 3))
    return contig[0] & whole[0], contig[1] & whole[1], klass


def traffic(table: TransferTable, topo, world: int, direct: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
    """[K, world] bytes (and message counts) of one instance of a table. ``direct``: (sender in place,
    receiver in place, class) per transfer (``zero_copy``); None: everything staged, one class."""
    cls = link_class(table, topo)
    out = np.zeros((K, world), dtype=np.float64)
    net = cls == 2
    nb = table.nbytes.astype(np.float64)
    n = len(table)
    src_direct, dst_direct, klass = direct if direct is not None else (np.zeros(n, bool), np.zeros(n, bool),
                                                                      np.zeros(n, np.int64))
    out[PACK_SEND] = np.bincount(table.src[~src_direct], weights=nb[~src_direct], minlength=world)
    out[PACK_RECV] = np.bincount(table.dst[~dst_direct], weights=nb[~dst_direct], minlength=world)
    out[NIC_SEND] = np.bincount(table.src[net], weights=nb[net], minlength=world)
    out[NIC_RECV] = np.bincount(table.dst[net], weights=nb[net], minlength=world)
    out[NVL_SEND] = np.bincount(table.src[~net], weights=nb[~net], minlength=world)
    out[NVL_RECV] = np.bincount(table.dst[~net], weights=nb[~net], minlength=world)
    # one message per distinct (src, dst, class), counted on both ends
    if n:
        keys = {(int(a), int(b), int(c)) for a, b, c in zip(table.src, table.dst, klass)}
        for a, b, _ in keys:
            out[MSGS, a] += 1
            out[MSGS, b] += 1
    return out


def _by_link(table: TransferTable, topo) -> np.ndarray:
    return np.bincount(link_class(table, topo), weights=table.nbytes.astype(np.float64), minlength=3)


def reference_p2p_stats(plan: Plan) -> PlanStats:
    world = plan.world
    topo = plan.topology
    unit_traffic: dict[int, np.ndarray] = {}
    masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    box_cache: dict = {}
    rounds = np.zeros((len(plan.rounds), K, world), dtype=np.float64)
    by_link = np.zeros(3, dtype=np.float64)
    max_staging = 0
    for r, rnd in enumerate(plan.rounds):
        staging = np.zeros(world, dtype=np.float64)
        for e in rnd.records():
            unit = plan.units[e.unit]
            n = e.inst_hi - e.inst_lo
            full = e.t_lo == 0 and e.t_hi == len(unit.table)
            direct = masks.get(e.unit)
            if direct is None:
                direct = masks[e.unit] = zero_copy(plan, unit, box_cache)
            if full:
                got = unit_traffic.get(e.unit)
                if got is None:
                    got = unit_traffic[e.unit] = (traffic(unit.table, topo, world, direct), _by_link(unit.table, topo))
                tr, links = got
            else:
                sl = slice(e.t_lo, e.t_hi)
                tab = unit.table.take(np.arange(e.t_lo, e.t_hi))
                tr, links = traffic(tab, topo, world, tuple(d[sl] for d in direct)), _by_link(tab, topo)
            rounds[r] += n * tr
            rounds[r, MSGS] -= n * tr[MSGS]
            rounds[r, MSGS] = np.maximum(rounds[r, MSGS], tr[MSGS])  # packed messages merge per peer
            staging += n * (tr[NIC_SEND] + tr[NIC_RECV] + tr[NVL_SEND] + tr[NVL_RECV])
            by_link += n * links
        max_staging = max(max_staging, int(staging.max()) if world else 0)
    per_rank = rounds.sum(axis=0) if len(plan.rounds) else np.zeros((K, world))
    return PlanStats(
        bytes_total=int(by_link.sum()),
        bytes_by_link={"intra_node": int(by_link[0]), "intra_domain": int(by_link[1]), "cross_domain": int(by_link[2])},
        num_transfers=plan.num_transfers,
        num_rounds=len(plan.rounds),
        rounds=rounds,
        max_staging=max_staging,
        per_rank=per_rank,
    )
