"""The per-instance routing (reshardctl 5aa7c63: ``route``, ``_relays``, ``_pick_balanced``), kept as the
reference the batched ``reshardctl.plan.routing.route_many`` must equal (tests/plan/test_routing_batched.py)."""

from __future__ import annotations

import numpy as np

from reshardctl.plan.pairs import PairPieces
from reshardctl.plan.routing import TransferTable
from reshardctl.topology import Topology


def _relays(pieces: PairPieces, src_ranks: np.ndarray, dst: np.ndarray, topo: Topology, rotation: int) -> np.ndarray:
    """For every piece: -1 if it comes from a trainer (stage 1), else the index of the piece whose
    destination relays it (stage 2). A group = destinations needing the same piece in one NVLink
    domain that holds no source replica of it; the relay rotates over the group, piece by piece."""
    n = len(pieces)
    dom = topo.domain_of
    relay_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return relay_of
    # does any source replica of the piece's class sit in the destination's domain?
    ndom = int(dom.max()) + 1
    in_domain = np.zeros(n, dtype=bool)
    for c, slots in enumerate(pieces.src_classes):
        idx = np.nonzero(pieces.src_class == c)[0]
        if idx.size:
            has_source = np.zeros(ndom, dtype=bool)  # per domain: holds a replica of class c
            has_source[dom[src_ranks[np.asarray(slots)]]] = True
            in_domain[idx] = has_source[dom[dst[idx]]]
    key = pieces.piece_key.astype(np.int64) * ndom + dom[dst]
    order = np.lexsort((dst, key))
    k_sorted = key[order]
    first = np.ones(n, dtype=bool)
    first[1:] = k_sorted[1:] != k_sorted[:-1]
    starts = np.nonzero(first)[0]
    sizes = np.diff(np.append(starts, n))
    gid = np.cumsum(first) - 1
    relay_pos = starts + (np.arange(len(starts)) + rotation) % sizes
    is_relay = np.zeros(n, dtype=bool)
    is_relay[relay_pos] = True
    follower = ~is_relay & ~in_domain[order] & (sizes[gid] > 1)
    relay_of[order[follower]] = order[relay_pos[gid[follower]]]
    return relay_of


def _same_rows(best: np.ndarray) -> list[np.ndarray]:
    """The rows of ``best`` (bool [m, k]) grouped by equal content, each group ascending."""
    m, k = best.shape
    if k <= 62:
        key = best.astype(np.int64) @ (np.int64(1) << np.arange(k, dtype=np.int64))
    else:
        key = np.unique(best, axis=0, return_inverse=True)[1].reshape(-1)
    order = np.argsort(key, kind="stable")
    cut = np.nonzero(key[order][1:] != key[order][:-1])[0] + 1
    return np.split(order, cut)


def _pick_balanced(best: np.ndarray, weight: np.ndarray, rotation: int) -> np.ndarray:
    """Index of the chosen candidate per row of ``best`` (bool [m, k]): rows with the same set of best
    candidates are split among them into runs of equal bytes (prefix sums of ``weight``), so replicas
    share the load by bytes, not by piece count; ``rotation`` shifts the split between instances."""
    pick = np.empty(best.shape[0], dtype=np.int64)
    for rows in _same_rows(best):
        cols = np.nonzero(best[rows[0]])[0]
        w = weight[rows].astype(np.float64)
        total = w.sum()
        mid = (np.cumsum(w) - w / 2) / total if total > 0 else (np.arange(rows.size) + 0.5) / rows.size
        j = (np.minimum((mid * cols.size).astype(np.int64), cols.size - 1) + rotation) % cols.size
        pick[rows] = cols[j]
    return pick


def reference_route(
    pieces: PairPieces,
    src_ranks: np.ndarray,  # global rank per source slot
    dst_ranks: np.ndarray,  # global rank per destination slot
    topo: Topology,
    itemsize: int,
    *,
    rotation: int = 0,
    relay: bool = False,
) -> TransferTable:
    n = len(pieces)
    dst = dst_ranks[pieces.dst_slot].astype(np.int32)
    src = np.empty(n, dtype=np.int32)
    node, dom = topo.node_of, topo.domain_of
    numel = np.prod(pieces.hi - pieces.lo, axis=1)
    relay_of = _relays(pieces, src_ranks, dst, topo, rotation) if relay else np.full(n, -1, dtype=np.int64)
    direct = relay_of < 0
    for c, slots in enumerate(pieces.src_classes):
        idx = np.nonzero((pieces.src_class == c) & direct)[0]
        if idx.size == 0:
            continue
        cands = src_ranks[np.asarray(slots)]
        if cands.size == 1:
            src[idx] = cands[0]
            continue
        d = dst[idx]
        score = (
            4 * (cands[None, :] == d[:, None])
            + 2 * (node[cands][None, :] == node[d][:, None])
            + (dom[cands][None, :] == dom[d][:, None])
        )
        best = score == score.max(axis=1, keepdims=True)
        src[idx] = cands[_pick_balanced(best, numel[idx], rotation)]
    stage = np.ones(n, dtype=np.int8)
    followers = np.nonzero(~direct)[0]
    src[followers] = dst[relay_of[followers]]
    stage[followers] = 2
    return TransferTable(src, dst, stage, pieces.lo, pieces.hi, numel.astype(np.int64) * itemsize)
