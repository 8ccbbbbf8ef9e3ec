"""One rank's p2p steps from a plan's rounds (``Plan.steps_for``), in one vectorised pass.

The rows of every unit's table that this rank sends or receives are found once (a comparison over the
concatenated tables), each round entry's share of them by two binary searches, and the (entry,
instance, row) triples this rank takes part in are expanded with array arithmetic; Python objects are
made only for what the rank executes: one ``Region`` per triple (a row's box shared by its instances),
one ``PeerRegions`` per peer and round. So a rank's cost is a few numpy passes over the plan's rows and
entries plus its own share, never a Python step per entry (a phased DeepSeek-V3 plan at 256 + 256 has
some 290k entries, of which a rank takes part in a few thousand).
"""

from __future__ import annotations

import numpy as np

from reshardctl.plan.schedule import P2PRound, PeerRegions, Region


def p2p_steps(units, rounds, rank: int) -> list[P2PRound]:
    """The p2p rounds global rank ``rank`` takes part in, in round order: per round its sends and its
    receives, one ``PeerRegions`` per peer (ascending), each peer's regions in (entry, instance, row)
    order. A row whose sender and receiver are both ``rank`` counts as a send."""
    if not rounds or not units:
        return []
    lens = np.fromiter((len(u.table) for u in units), dtype=np.int64, count=len(units))
    u_off = np.cumsum(lens) - lens
    src = np.concatenate([u.table.src for u in units])
    dst = np.concatenate([u.table.dst for u in units])
    mine = np.flatnonzero((src == rank) | (dst == rank))  # global rows, ascending
    if not mine.size:
        return []
    per_round = np.fromiter((len(r.entries) for r in rounds), dtype=np.int64, count=len(rounds))
    ent = np.concatenate([r.entries for r in rounds])
    e_round = np.repeat(np.arange(len(rounds), dtype=np.int64), per_round)
    base = u_off[ent[:, 0]]
    a = np.searchsorted(mine, base + ent[:, 3])
    k = np.searchsorted(mine, base + ent[:, 4]) - a  # this rank's rows in each entry
    sel = np.flatnonzero(k)
    if not sel.size:
        return []
    k, a = k[sel], a[sel]
    inst_lo = ent[sel, 1]
    per = k * (ent[sel, 2] - inst_lo)
    e_of = np.repeat(np.arange(sel.size), per)
    pos = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)  # instance-major in its entry
    kk = k[e_of]
    inst = inst_lo[e_of] + pos // kk
    row = mine[a[e_of] + pos % kk]
    t_lens = np.fromiter((len(u.tensors) for u in units), dtype=np.int64, count=len(units))
    t_off = np.cumsum(t_lens) - t_lens
    tensors = np.concatenate([u.tensors for u in units]).astype(np.int64)
    tensor = tensors[t_off[ent[sel, 0]][e_of] + inst]
    sending = src[row] == rank
    peer = np.where(sending, dst[row], src[row]).astype(np.int64)
    nbytes = np.concatenate([u.table.nbytes for u in units])[row]
    boxes = _boxes(units, u_off, np.unique(row))
    # groups: (round, receives after sends, peer), the triples' own order kept inside each
    r_of = e_round[sel][e_of]
    order = np.lexsort((peer, ~sending, r_of))
    key_r, key_s, key_p = r_of[order], sending[order], peer[order]
    cut = np.flatnonzero(np.r_[True, (key_r[1:] != key_r[:-1]) | (key_s[1:] != key_s[:-1])
                               | (key_p[1:] != key_p[:-1])]).tolist() + [order.size]
    regions = list(map(Region, tensor[order].tolist(), [boxes[r] for r in row[order].tolist()],
                       nbytes[order].tolist()))
    steps: list[P2PRound] = []
    g_round, g_send, g_peer = key_r[cut[:-1]].tolist(), key_s[cut[:-1]].tolist(), key_p[cut[:-1]].tolist()
    g = 0
    while g < len(g_round):
        r = g_round[g]
        sends, recvs = [], []
        while g < len(g_round) and g_round[g] == r:
            (sends if g_send[g] else recvs).append(PeerRegions(g_peer[g], tuple(regions[cut[g]:cut[g + 1]])))
            g += 1
        steps.append(P2PRound(rounds[r].index, rounds[r].stage, tuple(sends), tuple(recvs)))
    return steps


def _boxes(units, u_off: np.ndarray, rows: np.ndarray) -> dict[int, tuple]:
    """Global row -> its box ``((lo, hi), ...)`` for the given ascending rows, a unit at a time."""
    out: dict[int, tuple] = {}
    which = np.searchsorted(u_off, rows, side="right") - 1
    cut = np.flatnonzero(np.r_[True, which[1:] != which[:-1]]).tolist() + [rows.size]
    for i, j in zip(cut[:-1], cut[1:]):
        u = int(which[i])
        local = rows[i:j] - u_off[u]
        tab = units[u].table
        for g, lo, hi in zip(rows[i:j].tolist(), tab.lo[local].tolist(), tab.hi[local].tolist()):
            out[g] = tuple(zip(lo, hi))
    return out
