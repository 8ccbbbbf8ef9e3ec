"""The M2N reshard plan: group tensors by placement, intersect once per template pair, route, bucket."""

from __future__ import annotations

from typing import Callable

import numpy as np

from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec, TensorSpec
from reshardctl.plan.model import Unit
from reshardctl.layout.indexset import split_box
from reshardctl.layout.placement import box_numel
from reshardctl.plan.pairs import PairPieces, intersect_templates
from reshardctl.plan.rounds import Entry, Round, RoundPacker, chunk_transfers
from reshardctl.plan.routing import TransferTable, route_many
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
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
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


def staging_vector(table: TransferTable, world: int) -> np.ndarray:
    return (
        np.bincount(table.src, weights=table.nbytes, minlength=world)
        + np.bincount(table.dst, weights=table.nbytes, minlength=world)
    ).astype(np.int64)


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
        # the bytes of each distinct (src, dst) pair: a phase takes a pair whole
        key = src.astype(np.int64) * world + dst
        order = np.argsort(key)
        key = key[order]
        cut = np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1]
        weight = np.add.reduceat(nbytes[order], cut)
        psrc, pdst = np.divmod(key[cut], world)
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


def schedule_rounds(units: list[Unit], world: int, bound: int, first_index: int = 0) -> tuple[list[Unit], list[Round], list[np.ndarray]]:
    """Pack units into rounds: all stage-1 rounds, then stage-2. Oversized instances are split.

    A stage whose transfers spread over phases that each fit the bound on every rank
    (``phases_of_stage``) is one round per phase, every unit's transfers of that phase (its table
    ordered by phase, stably, so a phase is one range of it; all instances). Otherwise: first fit of
    the units, in model order, into rounds (``RoundPacker``).

    Returns the (possibly re-split, re-ordered) units, the rounds and the staging vector of every round."""
    out_units: list[Unit] = []
    rounds: list[Round] = []
    loads: list[np.ndarray] = []
    index = first_index
    for stage in (1, 2):
        staged = []  # (unit, its table split to the bound or not, its staging vector, or None if split)
        for u in (u for u in units if u.stage == stage):
            vec = staging_vector(u.table, world)
            if vec.max() > bound:
                staged.append((u, _split_table(u.table, u.itemsize, bound), None))
            else:
                staged.append((u, u.table, vec))
        if not staged:
            continue
        src = np.concatenate([t.src for _, t, _ in staged])
        dst = np.concatenate([t.dst for _, t, _ in staged])
        phases, phase_loads = phases_of_stage(
            src, dst, np.concatenate([t.nbytes * len(u.tensors) for u, t, _ in staged]).astype(np.float64),
            world, bound)
        if phases > 1:
            # every unit's table ordered by phase (stably), all units at once: one sort of the stage
            n = len(staged)
            lens = np.fromiter((len(t) for _, t, _ in staged), dtype=np.int64, count=n)
            starts = np.cumsum(lens) - lens
            ph = phase_of(src, dst, phases)
            key = np.repeat(np.arange(n, dtype=np.int64), lens) * phases + ph
            order = np.argsort(key, kind="stable")  # by unit, then phase: a unit's rows stay in its block
            cuts = np.searchsorted(key[order], (np.arange(n)[:, None] * phases + np.arange(phases + 1)).ravel())
            cuts = (cuts.reshape(n, phases + 1) - starts[:, None]).T  # [phase + 1, unit]
            first = len(out_units)
            for (u, table, _), a, z in zip(staged, starts.tolist(), (starts + lens).tolist()):
                out_units.append(Unit(u.tensors, table.take(order[a:z] - a), u.stage, u.itemsize))
            uids = np.arange(first, first + n)
            counts = np.fromiter((len(u.tensors) for u, _, _ in staged), dtype=np.int64, count=n)
            for p in range(phases):
                live = np.flatnonzero(cuts[p] < cuts[p + 1])
                if not live.size:  # no pair of ranks meets in this phase
                    continue
                entries = tuple(map(Entry, uids[live].tolist(), [0] * live.size, counts[live].tolist(),
                                    cuts[p, live].tolist(), cuts[p + 1, live].tolist()))
                rounds.append(Round(index, stage, entries))
                loads.append(phase_loads[p])
                index += 1
            continue
        packer = RoundPacker(world, bound, stage, index)
        for u, table, vec in staged:
            out_units.append(Unit(u.tensors, table, u.stage, u.itemsize))
            uid = len(out_units) - 1
            if vec is not None:
                packer.add_unit(uid, vec, len(u.tensors), 0, len(table))
                continue
            chunks = chunk_transfers(table.src, table.dst, table.nbytes, bound)
            starts = [0] * len(chunks)
            for inst in range(len(u.tensors)):
                packer.add_chunks(uid, inst, chunks, starts)
        stage_rounds, stage_loads = packer.finish()
        rounds.extend(stage_rounds)
        loads.extend(stage_loads)
        index += len(stage_rounds)
    return out_units, rounds, loads
