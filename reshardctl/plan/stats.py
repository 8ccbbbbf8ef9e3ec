"""Traffic accounting of a plan: bytes per rank, per link class, per round. Pure numpy.

Link classes, from the topology: ``intra_node`` (NVLink inside a node), ``intra_domain`` (NVLink
between nodes of one multi-node NVLink domain), ``cross_domain`` (the network: NICs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.distinct import distinct
from reshardctl.plan.refit_plan import Plan
from reshardctl.topology import infer_rank_of, is_trainer

# rows of a traffic matrix [K, world]: bytes per link and direction, messages (the executor's, wire.py:
# per peer and step, one per class of where its regions are contiguous), and the bytes that go through a
# staging block (copied by the sender, and by the receiver) rather than in place (runtime/arena.py)
NIC_SEND, NIC_RECV, NVL_SEND, NVL_RECV, MSGS, PACK_SEND, PACK_RECV = range(7)
K = 7
_EXPAND = 1 << 20  # (entry, rank) pairs expanded at once by p2p_stats (memory bound)
_CHUNK_ROWS = 1 << 14  # transfers p2p_stats takes at once (a run of slices; one slice may have more): its
# arrays (about 650 B a transfer) stay in memory the runs reuse: DeepSeek-V3 256 + 256 with 1 << 16 faults
# in 7.8k more fresh pages and takes 0.01-0.02 s longer; 1 << 12 is slower again (per-run overhead)


def _contiguous(lo: np.ndarray, hi: np.ndarray, hold_lo: np.ndarray, hold_hi: np.ndarray) -> np.ndarray:
    """Is each box [lo, hi) one contiguous byte range of its holding box (row-major)? True when, for some
    dim d, the dims before d have extent 1 and the dims after d span the holding box. (Leading dims of
    extent 1 in both boxes change no answer: that is how tables of fewer dims are padded.) The arrays
    are [ndim, n], a row per dim: every step is a pass over one contiguous row."""
    ndim, n = lo.shape
    if not ndim:
        return np.ones(n, dtype=bool)
    ext, hext = hi - lo, hold_hi - hold_lo
    full_after = [np.ones(n, dtype=bool)] * ndim  # [d]: the dims after d span the holding box
    for d in range(ndim - 2, -1, -1):
        full_after[d] = full_after[d + 1] & (ext[d + 1] == hext[d + 1])
    out = full_after[0].copy()
    ones_before = ext[0] == 1  # the dims before d + 1 have extent 1
    for d in range(1, ndim):
        out |= ones_before & full_after[d]
        ones_before &= ext[d] == 1
    return out


def _pad_front(a: np.ndarray, ndim: int, fill: int) -> np.ndarray:
    """[n, k] -> [n, ndim]: ``fill`` in the leading ``ndim - k`` columns."""
    if a.shape[1] == ndim:
        return a
    out = np.full((a.shape[0], ndim), fill, dtype=np.int64)
    out[:, ndim - a.shape[1]:] = a
    return out


def _slot_boxes(tpl) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slot of a template: how many boxes it holds, and the lo / hi of its box where it holds
    exactly one (rows of other slots are unused). Kept with the (immutable, interned) template: the
    plans of one command share it."""
    got = tpl.__dict__.get("_slot_boxes")
    if got is None:
        count = np.fromiter(map(len, tpl.holdings), dtype=np.int64, count=tpl.num_slots)
        one = np.nonzero(count == 1)[0]
        boxes = np.asarray([tpl.holdings[slot][0] for slot in one.tolist()], dtype=np.int64).reshape(
            one.size, len(tpl.shape), 2)
        slot_lo = np.zeros((tpl.num_slots, len(tpl.shape)), dtype=np.int64)
        slot_hi = np.zeros((tpl.num_slots, len(tpl.shape)), dtype=np.int64)
        slot_lo[one], slot_hi[one] = boxes[:, :, 0], boxes[:, :, 1]
        got = (count, slot_lo, slot_hi)
        object.__setattr__(tpl, "_slot_boxes", got)  # a frozen dataclass: its caches go this way
    return got


class _HoldingBoxes:
    """Every rank's box of the placements a plan's units use, stacked into one [rows, ndim] lo/hi pair
    (``ndim``: the plan's largest, shorter shapes padded in front). A rank holding several boxes (or
    none) gets the full tensor: contiguous there implies contiguous in any box holding it, so the
    zero-copy answer errs towards copying. Placements are registered first (``add``), then built at
    once per template (``arrays``): thousands of expert placements share a few templates."""

    def __init__(self, ndim: int):
        self.ndim = ndim
        self.ordinal: dict[int, int] = {}  # id(placement) -> its number
        self.placements: list[tuple] = []  # (placement, side world, shape); keeps the ids stable

    def add(self, p, side_world: int, shape: tuple[int, ...]) -> int:
        """The number of placement ``p`` (rows ``side_world``: one per side-local rank)."""
        k = self.ordinal.get(id(p))
        if k is None:
            k = self.ordinal[id(p)] = len(self.placements)
            self.placements.append((p, side_world, shape))
        return k

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """First row of every placement, and the stacked lo / hi."""
        groups: dict[tuple, list[int]] = {}
        for k, (p, world, shape) in enumerate(self.placements):
            groups.setdefault((id(p.template), world, shape), []).append(k)
        first = np.zeros(len(self.placements), dtype=np.int64)
        los, his = [], []
        rows = 0
        for (_, world, shape), ks in groups.items():
            tpl = self.placements[ks[0]][0].template
            shp = np.asarray(shape, dtype=np.int64)
            n = tpl.num_slots
            count, slot_lo, slot_hi = _slot_boxes(tpl)
            P = len(ks)
            ranks = np.asarray([self.placements[k][0].ranks for k in ks], dtype=np.int64).reshape(P, n)
            lo = np.zeros((P, world, shp.size), dtype=np.int64)
            hi = np.broadcast_to(shp, (P, world, shp.size)).copy()
            one = count == 1
            inst = np.repeat(np.arange(P), int(one.sum()))
            lo[inst, ranks[:, one].reshape(-1)] = np.tile(slot_lo[one], (P, 1))
            hi[inst, ranks[:, one].reshape(-1)] = np.tile(slot_hi[one], (P, 1))
            held = np.bincount((np.arange(P)[:, None] * world + ranks).reshape(-1), weights=np.tile(count, P),
                               minlength=P * world)[: P * world].reshape(P, world)
            many = held != 1
            lo[many] = 0
            hi[many] = shp
            los.append(_pad_front(lo.reshape(P * world, shp.size), self.ndim, 0))
            his.append(_pad_front(hi.reshape(P * world, shp.size), self.ndim, 1))
            first[ks] = rows + np.arange(P) * world
            rows += P * world
        empty = np.zeros((0, self.ndim), dtype=np.int64)
        return first, np.concatenate(los or [empty]), np.concatenate(his or [empty])


def _class_boxes(layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every side-local rank's box of every placement class of ``layout`` (``_HoldingBoxes``, as many
    dims as its largest tensor): per class its first row, and the [ndim, rows] lo / hi. Kept with the
    (immutable) layout: the plans of one command (reshard, hybrid, the candidates of --compare-infer)
    share it."""
    got = layout.__dict__.get("_class_boxes")
    if got is None:
        reps = layout.placement_classes()[1]
        boxes = _HoldingBoxes(max([len(p.template.shape) for p in reps] + [1]))
        for p in reps:
            boxes.add(p, layout.world_size, p.template.shape)
        first, lo, hi = boxes.arrays()
        got = layout.__dict__["_class_boxes"] = (first, np.ascontiguousarray(lo.T), np.ascontiguousarray(hi.T))
    return got


@dataclass(frozen=True)
class PlanStats:
    bytes_total: int  # p2p bytes moved (relayed bytes count on every hop)
    bytes_by_link: dict[str, int]
    num_transfers: int
    num_rounds: int
    rounds: np.ndarray  # [n_rounds, K, world]
    max_staging: int  # largest staging bytes of any rank in any round
    per_rank: np.ndarray  # [K, world] totals

    @property
    def cross_domain_bytes(self) -> int:
        return self.bytes_by_link["cross_domain"]


def _segments(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct unit slices the rounds reference, sorted by (unit, t_lo, t_hi): their unit, t_lo and
    t_hi; and per round entry: its round, its slice and its number of instances."""
    per_round = [len(rnd.entries) for rnd in plan.rounds]
    ent = np.concatenate([rnd.entries for rnd in plan.rounds]) if plan.rounds else np.zeros((0, 5), np.int64)
    e_round = np.repeat(np.arange(len(per_round), dtype=np.int64), per_round)
    unit, t_lo, t_hi = ent[:, 0], ent[:, 3], ent[:, 4]
    order = np.lexsort((t_hi, t_lo, unit))
    new = np.ones(order.size, dtype=bool)
    new[1:] = (np.diff(unit[order]) != 0) | (np.diff(t_lo[order]) != 0) | (np.diff(t_hi[order]) != 0)
    e_seg = np.empty(order.size, dtype=np.int64)
    e_seg[order] = np.cumsum(new) - 1
    first = order[new]
    return unit[first], t_lo[first], t_hi[first], e_round, e_seg, (ent[:, 2] - ent[:, 1]).astype(np.float64)


def _run_rows(tables: list, seg_u: np.ndarray, seg_lo: np.ndarray, seg_hi: np.ndarray, ndim: int):
    """The rows the slices of one run read, gathered from their units' tables: per unit of the run, the
    rows from its first slice's start to the furthest end of its slices there (slices are sorted by unit,
    then start), back to back. Returns each slice's first row among them, and their src, dst, nbytes and
    [ndim, rows] lo / hi (boxes padded in front to ``ndim`` dims). Only a run's rows at a time: no copy
    of every table of the plan (DeepSeek-V3 256 + 256: 25 MB, fresh memory to fault in)."""
    first = np.flatnonzero(np.r_[True, seg_u[1:] != seg_u[:-1]])  # each unit's first slice in the run
    count = np.diff(np.r_[first, seg_u.size])
    blo = seg_lo[first]
    bhi = np.maximum.reduceat(seg_hi, first)
    blen = bhi - blo
    starts = np.repeat(np.cumsum(blen) - blen - blo, count) + seg_lo
    cut = [(tables[u], a, b) for u, a, b in zip(seg_u[first].tolist(), blo.tolist(), bhi.tolist())]
    return (starts, np.concatenate([t.src[a:b] for t, a, b in cut]), np.concatenate([t.dst[a:b] for t, a, b in cut]),
            np.concatenate([t.nbytes[a:b] for t, a, b in cut]),
            np.concatenate([_pad_front(t.lo[a:b], ndim, 0).T for t, a, b in cut], axis=1),
            np.concatenate([_pad_front(t.hi[a:b], ndim, 1).T for t, a, b in cut], axis=1))


def _slices_traffic(s0, s1, length, run_rows, tbase, ibase, hold_lo, hold_hi,
                    inst, by_seg, seg_sorted, e_round, e_n, world, T, topo, sums, most) -> np.ndarray:
    """``p2p_stats`` for the slices ``[s0, s1)`` (``run_rows``: their rows, ``_run_rows``): adds their
    entries' traffic rows into ``sums`` (per traffic row, [rounds * world]) and their message counts into
    ``most`` (maxima); returns their bytes per link class (intra node, intra domain, cross domain) over
    all their instances."""
    n = s1 - s0
    ln = length[s0:s1]
    starts, src_run, dst_run, nb_run, lo_run, hi_run = run_rows
    seg = np.repeat(np.arange(n), ln)  # per transfer, its slice in the run
    row = np.arange(seg.size) + np.repeat(starts - (np.cumsum(ln) - ln), ln)
    src = src_run[row].astype(np.int64)
    dst = dst_run[row].astype(np.int64)
    nb = nb_run[row].astype(np.float64)
    # each transfer against each side's holding box: contiguous there (its message class, wire.py) and
    # a whole box there (in place, no staging copy: a message of whole boxes lies back to back in the
    # rank's arena, boxes in first-use order; a part of a box is staged, which errs towards copying)
    # (np.take: several times faster than fancy indexing for rows of a 2-D array)
    lo, hi = np.take(lo_run, row, axis=1), np.take(hi_run, row, axis=1)
    tb, ib = tbase[s0:s1][seg], ibase[s0:s1][seg]
    contig, whole = [], []
    for ranks in (src, dst):
        at = np.where(is_trainer(ranks, T), tb + ranks, ib + infer_rank_of(ranks, T))
        hl, hh = np.take(hold_lo, at, axis=1), np.take(hold_hi, at, axis=1)
        contig.append(_contiguous(lo, hi, hl, hh))
        whole.append(((lo == hl) & (hi == hh)).all(axis=0))
    del lo, hi, tb, ib, at, hl, hh, row
    src_direct, dst_direct = contig[0] & whole[0], contig[1] & whole[1]  # in place on that side
    klass = np.where(contig[0], np.where(contig[1], 0, 1), np.where(contig[1], 2, 3))
    node, dom = topo.node_of, topo.domain_of
    cls = np.where(node[src] == node[dst], 0, np.where(dom[src] == dom[dst], 1, 2))
    net = cls == 2

    # rounds[r, k] = sum over r's entries of instances x the slice's row: summed sparsely, over the
    # (slice, rank) pairs a slice touches (not a dense [slices x world] table: a plan has tens of
    # thousands of slices); each transfer's two touched pairs, sender's and receiver's, side by side
    keys = np.empty(2 * seg.size, dtype=np.int64)
    keys[0::2], keys[1::2] = seg * world + src, seg * world + dst
    touched, _, number = distinct(keys, inverse=True)  # the keys come in runs sorted by slice: a stable sort merges them
    src_pos, dst_pos = number[0::2], number[1::2]
    t_seg, t_rank = np.divmod(touched, world)  # by slice, then rank
    t_len = np.bincount(t_seg, minlength=n)
    t_first = np.cumsum(t_len) - t_len

    def on(at: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per touched pair, the sum of ``weights`` over its transfers."""
        return np.bincount(at, weights=weights, minlength=t_seg.size)

    over_net = nb * net
    in_node = nb - over_net
    values = {  # per touched pair: the slice's row of every summed traffic row
        PACK_SEND: on(src_pos, np.where(src_direct, 0.0, nb)),  # staged: not in place
        PACK_RECV: on(dst_pos, np.where(dst_direct, 0.0, nb)),
        NIC_SEND: on(src_pos, over_net),
        NIC_RECV: on(dst_pos, over_net),
        NVL_SEND: on(src_pos, in_node),
        NVL_RECV: on(dst_pos, in_node),
    }
    # one message per distinct (src, dst, class) of a slice, counted on both ends; per round the
    # largest count of any of its entries (a pair's messages merge per class within a step)
    first = distinct(((seg * world + src) * world + dst) * 4 + klass, first=True).first  # one transfer of each
    msgs = (np.bincount(src_pos[first], minlength=t_seg.size)
            + np.bincount(dst_pos[first], minlength=t_seg.size))
    seg_links = np.bincount(seg * 3 + cls, weights=nb, minlength=n * 3).reshape(n, 3)
    by_link = inst[s0:s1] @ seg_links
    # the run's entries, expanded over their slices' touched pairs, a bounded number of pairs at a time:
    # where a run of entries covers consecutive slices once each (a phased plan: every entry its own
    # slice), their pairs are one range of the per-pair arrays, read in place
    a, b = np.searchsorted(seg_sorted, (s0, s1))
    segs_all = seg_sorted[a:b] - s0
    span = t_len[segs_all]
    ends = np.cumsum(span)
    R_world = most.size
    lo_e = 0
    while lo_e < segs_all.size:
        hi_e = max(lo_e + 1, int(np.searchsorted(ends, ends[lo_e] - span[lo_e] + _EXPAND, side="right")))
        sp = span[lo_e:hi_e]
        segs = segs_all[lo_e:hi_e]
        if segs.size == 1 or (np.diff(segs) == 1).all():
            pick = slice(int(t_first[segs[0]]), int(t_first[segs[-1]] + t_len[segs[-1]]))
        else:
            pick = np.arange(sp.sum()) + np.repeat(t_first[segs] - (np.cumsum(sp) - sp), sp)
        which = by_seg[a + lo_e:a + hi_e]
        bins = np.repeat(e_round[which] * world, sp) + t_rank[pick]
        scale = np.repeat(e_n[which], sp)
        for k, value in values.items():
            sums[k] += np.bincount(bins, weights=scale * value[pick], minlength=R_world)
        np.maximum.at(most, bins, msgs[pick])
        lo_e = hi_e
    return by_link


def p2p_stats(plan: Plan) -> PlanStats:
    """Traffic of every round, computed once per distinct unit slice over all their transfers at once.

    Per round r and rank: the byte and count rows are sums over the round's entries of (instances x the
    slice's row); ``MSGS`` is the largest per-peer message count of any one slice (packed messages merge
    per peer). Every figure is an integer-valued float64 far below 2**53, so sums are exact in any order."""
    world = plan.world
    topo = plan.topology
    T = plan.train_world
    seg_unit, seg_lo, seg_hi, e_round, e_seg, e_n = _segments(plan)
    R, S = len(plan.rounds), seg_unit.size
    rounds = np.zeros((R, K, world), dtype=np.float64)
    by_link = np.zeros(3, dtype=np.float64)
    if S:
        units = plan.units
        # per unit (a unit's slices share its placements): its first row in the concatenated tables
        # and its two placements' numbers (slices are sorted by unit)
        new_unit = np.r_[True, seg_unit[1:] != seg_unit[:-1]]
        used, seg_u = seg_unit[new_unit], np.cumsum(new_unit) - 1
        tables = [units[u].table for u in used.tolist()]
        u_first = np.fromiter((int(units[u].tensors[0]) for u in used.tolist()), dtype=np.int64, count=used.size)
        # every rank's box of every placement class, both sides in one [ndim, rows] pair (trainer rows first)
        t_row, t_lo, t_hi = _class_boxes(plan.train)
        i_row, i_lo, i_hi = _class_boxes(plan.infer)
        ndim = max(max(t.lo.shape[1] for t in tables), t_lo.shape[0], i_lo.shape[0])
        hold_lo = np.concatenate([_pad_front(t_lo.T, ndim, 0).T, _pad_front(i_lo.T, ndim, 0).T], axis=1)
        hold_hi = np.concatenate([_pad_front(t_hi.T, ndim, 1).T, _pad_front(i_hi.T, ndim, 1).T], axis=1)
        tbase = t_row[plan.train.placement_classes()[0][u_first]][seg_u]
        ibase = (i_row[plan.infer.placement_classes()[0][u_first]] + t_lo.shape[1])[seg_u]
        length = seg_hi - seg_lo
        inst = np.bincount(e_seg, weights=e_n, minlength=S)  # per slice: its instances over all entries
        # the entries by slice (sums and maxima do not depend on the order)
        by_seg = np.argsort(e_seg, kind="stable")
        seg_sorted = e_seg[by_seg]
        sums = {k: np.zeros(R * world) for k in (PACK_SEND, PACK_RECV, NIC_SEND, NIC_RECV, NVL_SEND, NVL_RECV)}
        most = np.zeros(R * world, dtype=np.int64)
        # slices a run at a time, each run's transfers at most _CHUNK_ROWS (or one slice): every array of
        # a run is small, reused by the next (no pass holds an array per transfer of the whole plan)
        ends = np.cumsum(length)
        s0 = 0
        while s0 < S:
            s1 = max(s0 + 1, int(np.searchsorted(ends, ends[s0] - length[s0] + _CHUNK_ROWS, side="right")))
            # the run's rows, boxes as [ndim, n] (a row per dim: numpy's reductions over a short last axis are slow)
            run_rows = _run_rows(tables, seg_u[s0:s1], seg_lo[s0:s1], seg_hi[s0:s1], ndim)
            by_link += _slices_traffic(
                s0, s1, length, run_rows, tbase, ibase, hold_lo, hold_hi,
                inst, by_seg, seg_sorted, e_round, e_n, world, T, topo, sums, most)
            s0 = s1
        for k, total in sums.items():
            rounds[:, k] = total.reshape(R, world)
        rounds[:, MSGS] = most.reshape(R, world)
    staging = rounds[:, NIC_SEND] + rounds[:, NIC_RECV] + rounds[:, NVL_SEND] + rounds[:, NVL_RECV]
    max_staging = int(staging.max()) if R and world else 0
    per_rank = rounds.sum(axis=0) if R else np.zeros((K, world))
    return PlanStats(
        bytes_total=int(by_link.sum()),
        bytes_by_link={"intra_node": int(by_link[0]), "intra_domain": int(by_link[1]), "cross_domain": int(by_link[2])},
        num_transfers=plan.num_transfers,
        num_rounds=R,
        rounds=rounds,
        max_staging=max_staging,
        per_rank=per_rank,
    )


@dataclass(frozen=True)
class LandingCounts:
    """What each inference rank lands in its parameters after a commit (the cost model's ``landing``):
    per rank, the segments (one view per box of an HF tensor it holds: the one ``_foreach_copy_``'s list,
    ``api.Refitter._commit_copy``), the HF tensors it holds a part of (a framework loader's calls) and
    the bytes. The same for every transport: it depends on the inference layout only."""

    views: np.ndarray  # [infer_world] int64
    tensors: np.ndarray  # [infer_world] int64
    nbytes: np.ndarray  # [infer_world] int64


def landing_counts(plan: Plan) -> LandingCounts:
    """Per inference rank, by placement class (a handful of templates even for 44,544 expert tensors)."""
    I = plan.infer_world
    classes, reps = plan.infer.placement_classes()
    n_of = np.bincount(classes, minlength=len(reps)) if len(classes) else np.zeros(len(reps), dtype=np.int64)
    isz_of = np.bincount(classes, weights=plan.model.itemsizes, minlength=len(reps)) if len(classes) else \
        np.zeros(len(reps))
    views, tensors, nbytes = (np.zeros(I, dtype=np.int64) for _ in range(3))
    for c, p in enumerate(reps):
        n = int(n_of[c])
        if not n:
            continue
        count = _slot_boxes(p.template)[0]
        numel = p.template.slot_numels()
        ranks = np.asarray(p.ranks, dtype=np.int64)
        np.add.at(views, ranks, count * n)
        # one loader call per tensor per rank holding any of it (a rank may hold several slots)
        holders = np.flatnonzero(np.bincount(ranks[count > 0], minlength=I))
        tensors[holders] += n
        # bytes: the class's tensors may differ in dtype; their itemsizes summed (isz_of) x elements per slot
        np.add.at(nbytes, ranks, (numel * int(round(isz_of[c]))))
    return LandingCounts(views, tensors, nbytes)
