"""The M2N reshard plan: group tensors by placement, intersect once per template pair, route, bucket."""

from __future__ import annotations

from typing import Callable

import numpy as np

from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec, TensorSpec
from reshardctl.plan.distinct import distinct
from reshardctl.plan.refit_plan import Unit
from reshardctl.layout.indexset import split_box
from reshardctl.layout.placement import box_numel
from reshardctl.plan.pairs import PairPieces, intersect_templates
from reshardctl.plan.rounds import Entry, Round, RoundPacker, chunk_transfers, entry_array
from reshardctl.plan.routing import TransferTable, route_many
from reshardctl.plan.table_batch import pair_bytes, reordered, staging_vectors
from reshardctl.topology import Topology, infer_global


def group_tensors(
    model: ModelSpec, train: SideLayout, infer: SideLayout, select: Callable[[TensorSpec], bool] | None
) -> list[tuple[object, object, list[int]]]:
    """Tensors with the same (trainer placement, inference placement, itemsize), in model order of
    their first member, members ascending. Placements are the same when they share the template
    object and the ranks (``SideLayout.placement_classes``)."""
    tcls, treps = train.placement_classes()
    icls, ireps = infer.placement_classes()
    index = np.arange(len(model.tensors))
    if select is not None:
        index = index[np.fromiter(map(select, model.tensors), dtype=bool, count=len(model.tensors))]
    if not index.size:
        return []
    key = (tcls[index] * len(ireps) + icls[index]) * 16 + model.itemsizes[index]  # itemsize <= 8
    _, first, inverse = distinct(key, first=True, inverse=True)  # each key's first member, each tensor's key
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # groups in order of first member
    group = rank[inverse.reshape(-1)]
    order = np.argsort(group, kind="stable")  # index is ascending, so members stay ascending
    bounds = np.cumsum(np.bincount(group, minlength=first.size))[:-1]
    out = []
    for members in np.split(index[order], bounds):
        i = int(members[0])
        out.append((treps[tcls[i]], ireps[icls[i]], members.tolist()))
    return out


def routing_requests(
    model: ModelSpec,
    train: SideLayout,
    infer: SideLayout,
    topo: Topology,
    select: Callable[[TensorSpec], bool] | None = None,
    *,
    rotate_replicas: bool = True,
) -> list[tuple[np.ndarray, int, PairPieces, np.ndarray, np.ndarray, int]]:
    """``(tensors, itemsize, pieces, src_ranks, dst_ranks, rotation)`` per group of tensors with the same
    placements, in model order; with ``rotate_replicas``, a group whose pieces have k source replicas is
    cut into up to k interleaved subsets routed with successive rotations (replicas share the load
    across instances too)."""
    # pieces per template pair, kept with the trainer layout (with both templates, so their ids stay
    # theirs): the transports of one command and the m2n report intersect each pair once
    pair_cache: dict[tuple[int, int], tuple] = train.__dict__.setdefault("_pair_pieces", {})
    T = topo.train_world
    requests = []
    for gi, (sp, dp, members) in enumerate(group_tensors(model, train, infer, select)):
        pkey = (id(sp.template), id(dp.template))
        got = pair_cache.get(pkey)
        if got is None:
            got = pair_cache[pkey] = (sp.template, dp.template,
                                      intersect_templates(sp.template, dp.template, model.tensors[members[0]].name))
        pieces = got[2]
        itemsize = model.tensors[members[0]].itemsize
        src_ranks = np.asarray(sp.ranks, dtype=np.int32)
        dst_ranks = infer_global(np.asarray(dp.ranks, dtype=np.int32), T)
        k = max((len(c) for c in pieces.src_classes), default=1)
        nsub = min(k, len(members)) if k > 1 and rotate_replicas else 1
        members_arr = np.asarray(members, dtype=np.int32)
        for j in range(nsub):
            requests.append((members_arr[j::nsub], itemsize, pieces, src_ranks, dst_ranks, gi + j))
    return requests


def build_units(
    model: ModelSpec,
    train: SideLayout,
    infer: SideLayout,
    topo: Topology,
    *,
    relay: bool,
    select: Callable[[TensorSpec], bool] | None = None,
) -> list[Unit]:
    """Units of identical instances, stage-1 and stage-2 tables separated, in model order."""
    requests = routing_requests(model, train, infer, topo, select)
    units: list[Unit] = []
    for (tensors, itemsize, *_), table in zip(requests, route_requests(requests, topo, relay)):
        for stage in (1, 2):
            sel = np.nonzero(table.stage == stage)[0]
            if sel.size == len(table):  # all of one stage: the routed table itself, not a copy
                units.append(Unit(tensors, table, stage, itemsize))
            elif sel.size:
                units.append(Unit(tensors, table.take(sel), stage, itemsize))
    return units


def route_requests(requests: list[tuple], topo: Topology, relay: bool) -> list[TransferTable]:
    """Tables of ``(tensors, itemsize, pieces, src_ranks, dst_ranks, rotation)`` requests, in request
    order: requests of one pieces object (so of one pair of templates, same slot counts) routed at once."""
    batches: dict[int, list[int]] = {}
    for r, req in enumerate(requests):
        batches.setdefault(id(req[2]), []).append(r)
    tables: list[TransferTable | None] = [None] * len(requests)
    for rs in batches.values():
        got = route_many(
            requests[rs[0]][2],
            np.stack([requests[r][3] for r in rs]),
            np.stack([requests[r][4] for r in rs]),
            topo,
            np.asarray([requests[r][1] for r in rs]),
            np.asarray([requests[r][5] for r in rs]),
            relay=relay,
        )
        for r, table in zip(rs, got):
            tables[r] = table
    return tables


def _split_table(table: TransferTable, itemsize: int, bound: int) -> TransferTable:
    """Cut every transfer into row-major pieces of at most ``bound`` bytes.

    Vectorised for the common case (one row of the box fits: cut along dim 0 in equal steps); a box
    whose single row is larger than the bound goes through ``split_box`` (recursing inward)."""
    n, ndim = table.lo.shape
    ext = table.hi - table.lo
    row_bytes = np.prod(ext[:, 1:], axis=1) * itemsize if ndim > 1 else np.full(n, itemsize, dtype=np.int64)
    fits = row_bytes <= bound
    parts = []
    if fits.any():
        idx = np.nonzero(fits)[0]
        step = np.maximum(1, bound // row_bytes[idx])
        count = -(-ext[idx, 0] // step)
        rep = np.repeat(idx, count)
        k = np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count)  # piece number in its transfer
        lo, hi = table.lo[rep].copy(), table.hi[rep].copy()
        lo[:, 0] = table.lo[rep, 0] + k * np.repeat(step, count)
        hi[:, 0] = np.minimum(lo[:, 0] + np.repeat(step, count), table.hi[rep, 0])
        nbytes = (hi[:, 0] - lo[:, 0]) * row_bytes[rep]
        parts.append((rep, TransferTable(table.src[rep], table.dst[rep], table.stage[rep], lo, hi, nbytes.astype(np.int64))))
    max_elems = max(1, bound // itemsize)
    for t in np.nonzero(~fits)[0].tolist():
        box = tuple(zip(table.lo[t].tolist(), table.hi[t].tolist()))
        boxes = split_box(box, max_elems)
        m = len(boxes)
        parts.append((np.full(m, t), TransferTable(
            np.full(m, table.src[t], np.int32), np.full(m, table.dst[t], np.int32), np.full(m, table.stage[t], np.int8),
            np.asarray([[a for a, _ in b] for b in boxes], dtype=np.int64),
            np.asarray([[z for _, z in b] for b in boxes], dtype=np.int64),
            np.asarray([box_numel(b) * itemsize for b in boxes], dtype=np.int64))))
    origin = np.concatenate([o for o, _ in parts])
    merged = TransferTable.concat([t for _, t in parts])
    return merged.take(np.argsort(origin, kind="stable"))  # pieces stay in transfer order


def phases_of_stage(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, world: int, bound: int) -> tuple[int, np.ndarray]:
    """How many phases to spread a stage's transfers over (``nbytes``: all instances of a transfer), and
    the per-rank staging of each phase [phases, world]: the fewest phases among ``phase_candidates``
    (from the busiest rank's staging / bound up to twice that) whose every phase fits the bound on every
    rank (``phase_of``); ``(1, empty)`` where the stage fits one round or no candidate spreads it, e.g.
    relays inside an NVLink domain (a rank has too few peers there for phases to spread its load)."""
    total = np.bincount(src, weights=nbytes, minlength=world) + np.bincount(dst, weights=nbytes, minlength=world)
    need = max(1, -(-int(total.max(initial=0)) // bound))
    if need > 1:
        # the bytes of each distinct (src, dst) pair, in key order: a phase takes a pair whole
        psrc, pdst, weight = pair_bytes(src, dst, nbytes, world)
        for phases in phase_candidates(need):
            ph = phase_of(psrc, pdst, phases) * world
            load = (np.bincount(ph + psrc, weights=weight, minlength=phases * world)
                    + np.bincount(ph + pdst, weights=weight, minlength=phases * world))
            if load.max() <= bound:
                return phases, load.reshape(phases, world).astype(np.int64)
    return 1, np.zeros((0, world), dtype=np.int64)


def phase_candidates(need: int) -> list[int]:
    """Phase counts tried for a stage that needs at least ``need`` rounds: every count from ``need`` to
    ``2 need`` while ``need <= 16``; beyond, 17 steps of ``need / 16`` (each try is a pass over the
    stage's pairs, and a small bucket can make ``need`` thousands)."""
    return sorted({need + -(-need * j // 16) for j in range(17)})


def phase_of(src: np.ndarray, dst: np.ndarray, phases: int) -> np.ndarray:
    """Each transfer's phase: ``(src + dst) mod phases``. A rank talks to about ``peers / phases`` of its
    peers in each phase, each of them in one phase only (a Latin-square schedule: sender ``s`` meets
    receiver ``d`` in phase ``s + d``), so its messages grow with its peers, not with peers x rounds."""
    return (src.astype(np.int64) + dst) % phases


def _phase_order(lens: np.ndarray, src: np.ndarray, dst: np.ndarray, phases: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every unit's rows ordered by phase (stably), all units at once (one sort of the stage): ``order``
    (a permutation of the stage's concatenated rows; a unit's rows stay in its block), ``cuts``
    [phase + 1, unit] (phase p of unit u is rows ``cuts[p, u]:cuts[p + 1, u]`` of its reordered table)
    and ``starts`` (each unit's first row in the concatenation)."""
    n = lens.size
    starts = np.cumsum(lens) - lens
    key = np.repeat(np.arange(n, dtype=np.int64), lens) * phases + phase_of(src, dst, phases)
    order = np.argsort(key, kind="stable")  # by unit, then phase: a unit's rows stay in its block
    cuts = np.searchsorted(key[order], (np.arange(n)[:, None] * phases + np.arange(phases + 1)).ravel())
    cuts = (cuts.reshape(n, phases + 1) - starts[:, None]).T  # [phase + 1, unit]
    return order, cuts, starts


# Stages whose heavy pairs (no phase count fits one round per phase) are scheduled as multi-round
# phases: stage 1 (trainer -> inference) only. Stage 2 (relays inside an NVLink domain) keeps first
# fit: there a rank has few peers (first fit posts a few hundred messages, not thousands), and the
# DeepSeek-V3 256 + 256 and 512 + 512 plans, whose relays are such a stage, stay as they were.
HEAVY_PHASE_STAGES = (1,)
# Of the candidate phase counts, those whose rounds are within this factor of the fewest compete on
# messages (a few more rounds for far fewer messages per rank).
HEAVY_ROUNDS_TOLERANCE = 1.05
# A multi-round phase schedule is taken only if it needs at most this many times first fit's rounds
# (each round moves up to a bucket per rank: more rounds, more wire time); first fit is only packed
# to check when the phases take more than this many times the busiest rank's minimum.
HEAVY_ROUNDS_SLACK = 1.1


def heavy_phase_candidates(need: int) -> list[int]:
    """Phase counts tried for a stage with heavy pairs (``need``: rounds the busiest rank needs at
    least): ``need``, ``2 need`` and the powers of two from ``need / 8`` (at least 2) up to ``2 need``
    (world sizes are powers of two, so such a count tends to pair each rank with equally many peers per
    phase). Fewer phases than ``need / 8`` would put 8+ rounds in a phase, each with many peers: the
    messages phases save are lost (and packing them first fit takes longest)."""
    out = {need, 2 * need}
    q = 2
    while q <= 2 * need:
        if 8 * q >= need:
            out.add(q)
        q *= 2
    return sorted(c for c in out if c >= 2)


def _pack_phased(lens: np.ndarray, counts: list[int], src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                 world: int, bound: int, phases: int):
    """Phases of several rounds each: phase by phase, the phase's content in table order (unit by unit),
    first fit into the rounds of that phase only (opened as needed): a unit's phase slice takes whole
    instance ranges where they fit (as many instances as fit into each of the phase's rounds in turn,
    then new rounds), and a slice whose one instance exceeds the bound on some rank goes as chunks of
    consecutive rows (``chunk_transfers``), each chunk first fit. A pair of ranks meets only in its
    phase, so in a run of consecutive rounds; every round is within ``bound`` on every rank (rows are
    at most the bound: ``_split_table``).

    ``nbytes``: one instance's bytes per row. Returns ``(order, cuts, rounds, messages)``: the phase
    ordering (``_phase_order``), per round its entries (local unit ids) and its staging {rank: bytes},
    and the most messages a rank posts (one per peer and round it meets that peer in)."""
    order, cuts, starts = _phase_order(lens, src, dst, phases)
    live_p, live_u = np.nonzero(cuts[:-1] < cuts[1:])  # segments (phase, unit), phase-major
    a = cuts[live_p, live_u]
    ln = cuts[live_p + 1, live_u] - a
    nseg = ln.size
    seg = np.repeat(np.arange(nseg, dtype=np.int64), ln)
    rows = order[np.arange(seg.size) - np.repeat(np.cumsum(ln) - ln, ln) + np.repeat(starts[live_u] + a, ln)]
    s_r, d_r, b_r = src[rows], dst[rows], nbytes[rows]
    # per segment: the ranks it loads and one instance's bytes on each (sorted by segment, then rank)
    uk, _, inv = distinct(np.concatenate([seg * world + s_r, seg * world + d_r]), inverse=True)
    w = np.bincount(inv, weights=np.concatenate([b_r, b_r]).astype(np.float64)).astype(np.int64)
    sseg, srank = np.divmod(uk, world)
    lb = np.searchsorted(sseg, np.arange(nseg + 1)).tolist()
    rb = np.r_[0, np.cumsum(ln)].tolist()
    # one instance's largest per-rank bytes in each segment (whether it fits a round whole)
    wmax = (np.maximum.reduceat(w, lb[:-1]) if w.size else np.zeros(nseg, dtype=np.int64)).tolist()
    srank, w = srank.tolist(), w.tolist()
    pb = np.searchsorted(live_p, np.arange(phases + 1)).tolist()
    lu, al = live_u.tolist(), a.tolist()
    rounds: list[tuple[list[Entry], dict[int, int]]] = []
    rec_round: list[int] = []  # (round, segment) of every entry, for the message count
    rec_seg: list[int] = []
    for p in range(phases):
        if pb[p] == pb[p + 1]:
            continue
        first = len(rounds)
        for j in range(pb[p], pb[p + 1]):
            u, c, t0 = lu[j], counts[lu[j]], al[j]
            rv = list(zip(srank[lb[j]:lb[j + 1]], w[lb[j]:lb[j + 1]]))
            if wmax[j] <= bound:
                t1, placed = t0 + rb[j + 1] - rb[j], 0
                for i in range(first, len(rounds)):
                    ents, load = rounds[i]
                    k = min((bound - load.get(r, 0)) // x for r, x in rv)
                    if k > 0:
                        k = min(k, c - placed)
                        for r, x in rv:
                            load[r] = load.get(r, 0) + k * x
                        ents.append(Entry(u, placed, placed + k, t0, t1))
                        rec_round.append(i)
                        rec_seg.append(j)
                        placed += k
                        if placed == c:
                            break
                per = min(bound // x for _, x in rv) if placed < c else 0
                while placed < c:
                    k = min(per, c - placed)
                    rounds.append(([Entry(u, placed, placed + k, t0, t1)], {r: k * x for r, x in rv}))
                    rec_round.append(len(rounds) - 1)
                    rec_seg.append(j)
                    placed += k
                continue
            chunks = [(t0 + x, t0 + y, list(zip(rk.tolist(), v.tolist())))
                      for x, y, rk, v in chunk_transfers(s_r[rb[j]:rb[j + 1]], d_r[rb[j]:rb[j + 1]],
                                                         b_r[rb[j]:rb[j + 1]], bound)]
            where = [first] * len(chunks)  # as RoundPacker.add_chunks: loads only grow
            for inst in range(c):
                for q, (x, y, crv) in enumerate(chunks):
                    i = where[q]
                    while i < len(rounds) and any(rounds[i][1].get(r, 0) + v > bound for r, v in crv):
                        i += 1
                    if i == len(rounds):
                        rounds.append(([], {}))
                    where[q] = i
                    ents, load = rounds[i]
                    for r, v in crv:
                        load[r] = load.get(r, 0) + v
                    ents.append(Entry(u, inst, inst + 1, x, y))
                    rec_round.append(i)
                    rec_seg.append(j)
    # messages: the distinct (round, sender, receiver) of the entries (a chunk counted with its segment's pairs)
    pk = distinct(seg * (world * world) + s_r.astype(np.int64) * world + d_r).values
    pseg, pair = np.divmod(pk, world * world)
    pstart = np.searchsorted(pseg, np.arange(nseg))
    pcount = np.bincount(pseg, minlength=nseg)
    es, er = np.asarray(rec_seg, dtype=np.int64), np.asarray(rec_round, dtype=np.int64)
    cnt = pcount[es]
    idx = np.repeat(pstart[es], cnt) + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    sd = distinct(np.repeat(er, cnt) * (world * world) + pair[idx]).values % (world * world)
    ps, pd = np.divmod(sd, world)
    msgs = np.bincount(ps, minlength=world) + np.bincount(pd, minlength=world)
    return order, cuts, rounds, int(msgs.max(initial=0))


def heavy_phases(lens: np.ndarray, counts: list[int], src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                 world: int, bound: int, need: int):
    """The multi-round phase schedule of a stage no phase count fits as one round per phase: of
    ``heavy_phase_candidates(need)``, those within ``HEAVY_ROUNDS_TOLERANCE`` of the fewest rounds, and
    of them the one with the fewest messages on the busiest rank (ties: fewer rounds, fewer phases).
    A candidate whose lower bound (per phase, its busiest rank's staging / bound) is already past the
    tolerance is not packed. Returns ``(phases, order, cuts, rounds)``."""
    cands = heavy_phase_candidates(need)
    lower = {}
    w = (nbytes * np.asarray(counts, dtype=np.int64).repeat(lens)).astype(np.float64)  # all instances
    for phases in cands:
        ph = phase_of(src, dst, phases) * world
        load = (np.bincount(ph + src, weights=w, minlength=phases * world)
                + np.bincount(ph + dst, weights=w, minlength=phases * world)).reshape(phases, world)
        lower[phases] = int(np.ceil(load.max(axis=1) / bound).sum())
    done = []
    fewest = None
    for phases in sorted(cands, key=lambda q: (lower[q], q)):
        if fewest is not None and lower[phases] > HEAVY_ROUNDS_TOLERANCE * fewest:
            break  # sorted by the lower bound: no later one can be within the tolerance either
        order, cuts, rounds, msgs = _pack_phased(lens, counts, src, dst, nbytes, world, bound, phases)
        fewest = len(rounds) if fewest is None else min(fewest, len(rounds))
        done.append(((msgs, len(rounds), phases), order, cuts, rounds))
    ok = [d for d in done if d[0][1] <= HEAVY_ROUNDS_TOLERANCE * fewest]
    (msgs, _, phases), order, cuts, rounds = min(ok, key=lambda d: d[0])
    return phases, order, cuts, rounds


def schedule_rounds(units: list[Unit], world: int, bound: int, first_index: int = 0) -> tuple[list[Unit], list[Round], list[np.ndarray]]:
    """Pack units into rounds: all stage-1 rounds, then stage-2. Oversized instances are split.

    A stage whose transfers spread over phases that each fit the bound on every rank
    (``phases_of_stage``) is one round per phase, every unit's transfers of that phase (its table
    ordered by phase, stably, so a phase is one range of it; all instances). A stage-1 stage that no
    phase count fits so (heavy pairs: one pair's bytes alone exceed the bound) is phases of several
    consecutive rounds each (``heavy_phases``), when that needs at most ``HEAVY_ROUNDS_SLACK`` x first
    fit's rounds. Otherwise: first fit of the units, in model order, into rounds (``RoundPacker``).

    Returns the (possibly re-split, re-ordered) units, the rounds and the staging vector of every round."""
    out_units: list[Unit] = []
    rounds: list[Round] = []
    loads: list[np.ndarray] = []
    index = first_index
    for stage in (1, 2):
        of_stage = [u for u in units if u.stage == stage]
        if not of_stage:
            continue
        staged = []  # (unit, its table split to the bound or not, its staging vector, or None if split)
        for u, vec in zip(of_stage, staging_vectors([u.table for u in of_stage], world)):
            if vec.max() > bound:
                staged.append((u, _split_table(u.table, u.itemsize, bound), None))
            else:
                staged.append((u, u.table, vec))
        src = np.concatenate([t.src for _, t, _ in staged])
        dst = np.concatenate([t.dst for _, t, _ in staged])
        nbytes = np.concatenate([t.nbytes * len(u.tensors) for u, t, _ in staged]).astype(np.float64)
        phases, phase_loads = phases_of_stage(src, dst, nbytes, world, bound)
        n = len(staged)
        lens = np.fromiter((len(t) for _, t, _ in staged), dtype=np.int64, count=n)
        uids = np.arange(len(out_units), len(out_units) + n)
        if phases > 1:
            # every unit's table ordered by phase (stably), all units at once: one sort of the stage
            order, cuts, starts = _phase_order(lens, src, dst, phases)
            for (u, _, _), table in zip(staged, reordered([t for _, t, _ in staged], order, lens)):
                out_units.append(Unit(u.tensors, table, u.stage, u.itemsize))
            counts = np.fromiter((len(u.tensors) for u, _, _ in staged), dtype=np.int64, count=n)
            # every (phase, unit) that has transfers, phase-major: phase p's round holds its run of them
            live_p, live_u = np.nonzero(cuts[:-1] < cuts[1:])
            ents = np.stack([uids[live_u], np.zeros(live_u.size, dtype=np.int64), counts[live_u],
                             cuts[live_p, live_u], cuts[live_p + 1, live_u]], axis=1)
            ents.flags.writeable = False
            bounds = np.searchsorted(live_p, np.arange(phases + 1)).tolist()
            for p in range(phases):
                if bounds[p] == bounds[p + 1]:  # no pair of ranks meets in this phase
                    continue
                rounds.append(Round(index, stage, ents[bounds[p]:bounds[p + 1]]))
                loads.append(phase_loads[p])
                index += 1
            continue
        total = np.bincount(src, weights=nbytes, minlength=world) + np.bincount(dst, weights=nbytes, minlength=world)
        need = -(-int(total.max(initial=0)) // bound)
        heavy = None
        if stage in HEAVY_PHASE_STAGES and need > 1:
            heavy = heavy_phases(lens, [len(u.tensors) for u, _, _ in staged], src, dst,
                                 np.concatenate([t.nbytes for _, t, _ in staged]), world, bound, need)
        first_fit = None
        if heavy is not None and len(heavy[3]) > HEAVY_ROUNDS_SLACK * need:
            first_fit = _first_fit_stage(staged, len(out_units), world, bound, stage, index)
            if len(heavy[3]) > HEAVY_ROUNDS_SLACK * len(first_fit[1]):
                heavy = None
        if heavy is not None:
            _, order, _, phase_rounds = heavy
            starts = np.cumsum(lens) - lens
            for (u, table, _), a, z in zip(staged, starts.tolist(), (starts + lens).tolist()):
                out_units.append(Unit(u.tensors, table.take(order[a:z] - a), u.stage, u.itemsize))
            base = int(uids[0])
            for ents, load in phase_rounds:
                rounds.append(Round(index, stage, entry_array(np.asarray(ents, dtype=np.int64).reshape(-1, 5)
                                                              + (base, 0, 0, 0, 0))))
                vec = np.zeros(world, dtype=np.int64)
                vec[list(load)] = list(load.values())
                loads.append(vec)
                index += 1
            continue
        stage_units, stage_rounds, stage_loads = first_fit or _first_fit_stage(staged, len(out_units), world, bound,
                                                                               stage, index)
        out_units.extend(stage_units)
        rounds.extend(stage_rounds)
        loads.extend(stage_loads)
        index += len(stage_rounds)
    return out_units, rounds, loads


def _first_fit_stage(staged: list, first_uid: int, world: int, bound: int, stage: int, index: int):
    """First fit of a stage's units, in model order, into rounds (``RoundPacker``): the units (numbered
    from ``first_uid``), the rounds (from ``index``) and their staging vectors."""
    out_units = []
    packer = RoundPacker(world, bound, stage, index)
    for u, table, vec in staged:
        out_units.append(Unit(u.tensors, table, u.stage, u.itemsize))
        uid = first_uid + len(out_units) - 1
        if vec is not None:
            packer.add_unit(uid, vec, len(u.tensors), 0, len(table))
            continue
        chunks = chunk_transfers(table.src, table.dst, table.nbytes, bound)
        starts = [0] * len(chunks)
        for inst in range(len(u.tensors)):
            packer.add_chunks(uid, inst, chunks, starts)
    stage_rounds, stage_loads = packer.finish()
    return out_units, stage_rounds, stage_loads
