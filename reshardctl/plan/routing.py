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
        return TransferTable(self.src[idx], self.dst[idx], self.stage[idx], self.lo[idx], self.hi[idx], self.nbytes[idx])

    @staticmethod
    def concat(tables: list["TransferTable"]) -> "TransferTable":
        return TransferTable(*(np.concatenate([getattr(t, f) for t in tables]) for f in ("src", "dst", "stage", "lo", "hi", "nbytes")))


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
    n = len(pieces)
    dst = dst_ranks[pieces.dst_slot].astype(np.int32)
    src = np.empty(n, dtype=np.int32)
    node, dom = topo.node_of, topo.domain_of
    for c, slots in enumerate(pieces.src_classes):
        idx = np.nonzero(pieces.src_class == c)[0]
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
        count = best.sum(axis=1)
        j = (np.arange(idx.size) + rotation) % count
        pick = np.argmax(np.cumsum(best, axis=1) > j[:, None], axis=1)
        src[idx] = cands[pick]
    stage = np.ones(n, dtype=np.int8)
    if relay and n:
        # groups of (same piece, same destination domain) whose source is outside that domain
        key = pieces.piece_key.astype(np.int64) * (int(dom.max()) + 1) + dom[dst]
        remote = dom[src] != dom[dst]
        order = np.lexsort((dst, key))
        k_sorted = key[order]
        first = np.ones(n, dtype=bool)
        first[1:] = k_sorted[1:] != k_sorted[:-1]
        starts = np.nonzero(first)[0]
        sizes = np.diff(np.append(starts, n))
        gid = np.cumsum(first) - 1  # group id of each sorted position
        # the relay rotates over the group's destinations (piece by piece), so the network bytes
        # entering a domain spread over all its replicas' NICs instead of piling onto replica 0
        relay_pos = starts + (np.arange(len(starts)) + rotation) % sizes
        is_relay = np.zeros(n, dtype=bool)
        is_relay[relay_pos] = True
        relay_of = order[relay_pos[gid]]
        is_follower = ~is_relay & remote[order]
        followers = order[is_follower]
        src[followers] = dst[relay_of[is_follower]]
        stage[followers] = 2
    numel = np.prod(pieces.hi - pieces.lo, axis=1)
    return TransferTable(src, dst, stage, pieces.lo, pieces.hi, numel.astype(np.int64) * itemsize)
