"""Route the pieces of one tensor instance to concrete global ranks (topology-aware, pure).

* A piece held by several source replicas (trainer DP copies, replicated norms) is taken from the
  best-placed replica: same node as the destination, else same NVLink domain, else any; ties are
  broken by rotating over the destinations, so replicas share the load.
* Two-stage fan-out (``relay=True``): when several destination replicas in one NVLink domain need the
  same piece and no source replica is in that domain, one of them (the relay) receives it over the
  network (stage 1) and forwards it to the others over NVLink (stage 2). Cross-domain bytes then
  count once per domain instead of once per replica.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reshardctl.plan.pairs import PairPieces
from reshardctl.topology import Topology


@dataclass(frozen=True)
class TransferTable:
    """Concrete transfers of one tensor instance (all tensors of a plan group share it)."""

    src: np.ndarray  # int32 global rank
    dst: np.ndarray  # int32 global rank
    stage: np.ndarray  # int8: 1 from a trainer rank, 2 forwarded by an inference relay
    lo: np.ndarray  # int64 [n, ndim]
    hi: np.ndarray  # int64 [n, ndim]
    nbytes: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def take(self, idx: np.ndarray) -> "TransferTable":
        # np.take: for the [n, ndim] boxes several times faster than fancy indexing (numpy 2.4)
        return TransferTable(self.src[idx], self.dst[idx], self.stage[idx], np.take(self.lo, idx, axis=0),
                             np.take(self.hi, idx, axis=0), self.nbytes[idx])

    @staticmethod
    def concat(tables: list["TransferTable"]) -> "TransferTable":
        return TransferTable(*(np.concatenate([getattr(t, f) for t in tables]) for f in ("src", "dst", "stage", "lo", "hi", "nbytes")))


def _relays(pieces: PairPieces, src_ranks: np.ndarray, dst: np.ndarray, topo: Topology,
            rotation: np.ndarray) -> np.ndarray:
    """Per instance b and piece: -1 if it comes from a trainer (stage 1), else the index of the piece
    whose destination relays it (stage 2). A group = destinations needing the same piece in one NVLink
    domain that holds no source replica of it; the relay rotates over the group, piece by piece
    (``rotation[b]`` shifts it). ``src_ranks`` [B, slots], ``dst`` [B, n]."""
    B, n = dst.shape
    dom = topo.domain_of
    relay_of = np.full((B, n), -1, dtype=np.int64)
    if n == 0 or B == 0:
        return relay_of
    inst = np.arange(B)[:, None]
    # does any source replica of the piece's class sit in the destination's domain?
    ndom = int(dom.max()) + 1
    in_domain = np.zeros((B, n), dtype=bool)
    for c, slots in enumerate(pieces.src_classes):
        idx = np.nonzero(pieces.src_class == c)[0]
        if idx.size:
            has_source = np.zeros((B, ndom), dtype=bool)  # per domain: holds a replica of class c
            has_source[inst, dom[np.take(src_ranks, slots, axis=1)]] = True
            in_domain[:, idx] = has_source[inst, dom[np.take(dst, idx, axis=1)]]
    # one flat problem: the instance is the leading key, so groups never span instances
    span = (int(pieces.piece_key.max()) + 1) * ndom
    key = (inst * span + pieces.piece_key.astype(np.int64)[None, :] * ndom + dom[dst]).reshape(-1)
    order = np.lexsort((dst.reshape(-1), key))
    k_sorted = key[order]
    first = np.ones(B * n, dtype=bool)
    first[1:] = k_sorted[1:] != k_sorted[:-1]
    starts = np.nonzero(first)[0]
    sizes = np.diff(np.append(starts, B * n))
    gid = np.cumsum(first) - 1
    owner = starts // n  # the instance of each group
    number = np.arange(starts.size) - np.searchsorted(owner, owner)  # the group's number within its instance
    relay_pos = starts + (number + rotation[owner]) % sizes
    is_relay = np.zeros(B * n, dtype=bool)
    is_relay[relay_pos] = True
    follower = ~is_relay & ~in_domain.reshape(-1)[order] & (sizes[gid] > 1)
    flat = relay_of.reshape(-1)
    flat[order[follower]] = order[relay_pos[gid[follower]]] % n
    return relay_of


def _pick_balanced(best: np.ndarray, weight: np.ndarray, rotation: np.ndarray, inst: np.ndarray) -> np.ndarray:
    """Index of the chosen candidate per row of ``best`` (bool [m, k]; rows of instance ``inst``, in
    ascending row order per instance): rows of one instance with the same set of best candidates are
    split among them into runs of equal bytes (prefix sums of ``weight``), so replicas share the load by
    bytes, not by piece count; ``rotation`` (per row) shifts the split between instances."""
    m, k = best.shape
    if k <= 62:
        cand_key = best.astype(np.int64) @ (np.int64(1) << np.arange(k, dtype=np.int64))
    else:
        cand_key = np.unique(best, axis=0, return_inverse=True)[1].reshape(-1)
    order = np.lexsort((cand_key, inst))  # stable: rows ascending inside a group
    cut = np.ones(m, dtype=bool)
    cut[1:] = (cand_key[order][1:] != cand_key[order][:-1]) | (inst[order][1:] != inst[order][:-1])
    group = np.cumsum(cut) - 1
    start = np.nonzero(cut)[0]
    size = np.diff(np.append(start, m))
    w = weight[order].astype(np.float64)
    csum = np.cumsum(w)  # integers: exact, so a group's prefix sums are exact differences
    before = (csum[start] - w[start])[group]
    total = (csum[start + size - 1] - csum[start] + w[start])[group]
    pos = np.arange(m) - start[group]
    best = np.take(best, order, axis=0)  # rows in group order (np.take: faster than best[order] for 2-D)
    ncols = best.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mid = np.where(total > 0, (csum - before - w / 2) / total, (pos + 0.5) / size[group])
    j = (np.minimum((mid * ncols).astype(np.int64), ncols - 1) + rotation[order]) % ncols
    col = np.argmax(np.cumsum(best, axis=1) > j[:, None], axis=1)  # the j-th best candidate
    pick = np.empty(m, dtype=np.int64)
    pick[order] = col
    return pick


def route_many(
    pieces: PairPieces,
    src_ranks: np.ndarray,  # [B, source slots] global rank per source slot
    dst_ranks: np.ndarray,  # [B, destination slots] global rank per destination slot
    topo: Topology,
    itemsize: np.ndarray,  # [B]
    rotation: np.ndarray,  # [B]
    *,
    relay: bool = False,
) -> list[TransferTable]:
    """``route`` for B instances of the same pieces at once (one table each)."""
    B, n = len(rotation), len(pieces)
    rotation = np.asarray(rotation, dtype=np.int64)
    dst = np.take(dst_ranks, pieces.dst_slot, axis=1).astype(np.int32)
    src = np.empty((B, n), dtype=np.int32)
    node, dom = topo.node_of, topo.domain_of
    numel = np.prod(pieces.hi - pieces.lo, axis=1)
    relay_of = _relays(pieces, src_ranks, dst, topo, rotation) if relay else np.full((B, n), -1, dtype=np.int64)
    direct = relay_of < 0
    for c, slots in enumerate(pieces.src_classes):
        inst, idx = np.nonzero((pieces.src_class == c)[None, :] & direct)
        if idx.size == 0:
            continue
        cands = np.take(np.take(src_ranks, slots, axis=1), inst, axis=0)  # [m, k]
        if cands.shape[1] == 1:
            src[inst, idx] = cands[:, 0]
            continue
        d = dst[inst, idx]
        score = (
            4 * (cands == d[:, None])
            + 2 * (node[cands] == node[d][:, None])
            + (dom[cands] == dom[d][:, None])
        )
        best = score == score.max(axis=1, keepdims=True)
        src[inst, idx] = cands[np.arange(idx.size), _pick_balanced(best, numel[idx], rotation[inst], inst)]
    stage = np.ones((B, n), dtype=np.int8)
    inst, followers = np.nonzero(~direct)
    src[inst, followers] = dst[inst, relay_of[inst, followers]]
    stage[inst, followers] = 2
    nbytes = numel.astype(np.int64)
    return [TransferTable(src[b], dst[b], stage[b], pieces.lo, pieces.hi, nbytes * int(itemsize[b])) for b in range(B)]


def route(
    pieces: PairPieces,
    src_ranks: np.ndarray,  # global rank per source slot
    dst_ranks: np.ndarray,  # global rank per destination slot
    topo: Topology,
    itemsize: int,
    *,
    rotation: int = 0,
    relay: bool = False,
) -> TransferTable:
    """The transfers of one tensor instance: a source replica and a stage for every piece."""
    return route_many(pieces, np.asarray(src_ranks)[None, :], np.asarray(dst_ranks)[None, :], topo,
                      np.asarray([itemsize]), np.asarray([rotation]), relay=relay)[0]
