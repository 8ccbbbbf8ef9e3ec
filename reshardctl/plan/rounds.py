"""Bucketing: pack transfers into global rounds whose staging memory per rank stays within a bound.

Staging of a rank in a round = bytes it packs to send + bytes it receives. Work arrives as *units*:
``count`` identical tensor instances, each with the same per-rank load vector, so tens of thousands of
expert tensors cost one numpy step each, not one Python object per transfer.

Packing is first-fit over all open rounds (not next-fit): a unit's instances go into the earliest
rounds where every rank it touches still has room, so one round carries the work of many disjoint
rank sets at once. A unit whose single instance exceeds the bound on some rank is split into pieces
(``split_box``) and placed transfer by transfer. The bound holds by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Entry(NamedTuple):
    """A slice of a unit inside a round: instances ``[inst_lo, inst_hi)``, transfers ``[t_lo, t_hi)``.
    One row of ``Round.entries``; the packers build them one by one, ``Round.records`` reads them back."""

    unit: int
    inst_lo: int
    inst_hi: int
    t_lo: int
    t_hi: int


def entry_array(entries) -> np.ndarray:
    """Entries (``Entry`` tuples, or rows of five ints) as a read-only ``[n, 5]`` int64 array."""
    a = np.array(entries, dtype=np.int64).reshape(-1, 5)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Round:
    """One p2p round: ``entries`` is an ``[n, 5]`` int64 array, one ``Entry`` (unit, inst_lo, inst_hi,
    t_lo, t_hi) per row. An array, not a tuple of ``Entry`` objects: a phased plan of DeepSeek-V3 at
    256 + 256 has some 290k entries, which the planner, the fingerprint, the traffic accounting and
    every rank's program read column-wise. (Compared by identity: an array has no single truth value.)"""

    index: int
    stage: int
    entries: np.ndarray

    def records(self) -> list[Entry]:
        """The entries as ``Entry`` tuples, for readers that walk them one by one."""
        return list(map(Entry._make, self.entries.tolist()))


class RoundPacker:
    """First-fit packing into rounds of one stage; ``finish()`` returns them in order."""

    def __init__(self, world: int, bound: int, stage: int, first_index: int):
        self.world = world
        self.bound = bound
        self.stage = stage
        self.first_index = first_index
        self.load = np.zeros((0, world), dtype=np.int64)  # [rounds, world]
        self.entries: list[list[Entry]] = []

    def _grow(self, n: int) -> None:
        self.load = np.concatenate([self.load, np.zeros((n, self.world), dtype=np.int64)])
        self.entries.extend([] for _ in range(n))

    def add_unit(self, unit: int, load: np.ndarray, count: int, t_lo: int, t_hi: int) -> None:
        """``count`` instances of transfers ``[t_lo, t_hi)`` of a unit, whose per-instance staging vector
        is ``load`` (max <= bound)."""
        nz = np.nonzero(load)[0]
        if nz.size == 0:
            return
        v = load[nz]
        if count == 1:  # the common case: the first round where every touched rank has room for it
            r = self._first_fit(nz, v)
            self.load[r, nz] += v
            self.entries[r].append(Entry(unit, 0, 1, t_lo, t_hi))
            return
        self._place_many(unit, nz, v, count, t_lo, t_hi)

    def _first_fit(self, ranks: np.ndarray, v: np.ndarray, start: int = 0) -> int:
        """The first round from ``start`` where every rank in ``ranks`` has room for ``v`` more bytes (a
        new one if none)."""
        lo, step, n = start, 8, len(self.load)
        while lo < n:  # in growing windows: the room is usually in the first few rounds looked at
            hi = min(n, lo + step)
            hits = np.flatnonzero((self.load[lo:hi, ranks] + v <= self.bound).all(axis=1))
            if hits.size:
                return lo + int(hits[0])
            lo, step = hi, step * 4
        self._grow(1)
        return len(self.load) - 1

    def _place_many(self, unit: int, nz: np.ndarray, v: np.ndarray, count: int, t_lo: int, t_hi: int) -> None:
        """First fit of ``count`` instances loading ranks ``nz`` by ``v`` each: as many as fit into each
        open round in order, then new rounds."""
        per_new = int((self.bound // v).min())  # instances that fit in an empty round (>= 1)
        room = ((self.bound - self.load[:, nz]) // v).min(axis=1) if len(self.load) else np.zeros(0, np.int64)
        room = np.maximum(room, 0)
        take = np.minimum(room, np.maximum(count - (np.cumsum(room) - room), 0))
        placed = int(take.sum())
        if placed < count:
            extra = -(-(count - placed) // per_new)
            self._grow(extra)
            rest = count - placed
            new_take = np.full(extra, per_new, dtype=np.int64)
            new_take[-1] = rest - per_new * (extra - 1)
            take = np.concatenate([take, new_take])
        used = np.nonzero(take)[0]
        self.load[np.ix_(used, nz)] += take[used, None] * v
        pos = 0
        for r, k in zip(used.tolist(), take[used].tolist()):
            self.entries[r].append(Entry(unit, pos, pos + k, t_lo, t_hi))
            pos += k

    def add_chunks(self, unit: int, inst: int, chunks: list[tuple[int, int, np.ndarray, np.ndarray]],
                   starts: list[int]) -> None:
        """One oversized instance, as ``chunk_transfers`` cut its unit's table, each chunk placed first
        fit. ``starts[k]``: where chunk k of the unit's previous instance went, kept between calls: a
        round that had no room for it then has none now (loads only grow), so the search starts there
        (the same rounds as a search from round 0, without rescanning the full ones)."""
        for k, (a, z, ranks, v) in enumerate(chunks):
            r = self._first_fit(ranks, v, starts[k])
            starts[k] = r
            self.load[r, ranks] += v
            self.entries[r].append(Entry(unit, inst, inst + 1, a, z))

    def finish(self) -> tuple[list[Round], list[np.ndarray]]:
        rounds = [Round(self.first_index + i, self.stage, entry_array(e)) for i, e in enumerate(self.entries)]
        return rounds, [self.load[i].copy() for i in range(len(self.load))]


def chunk_transfers(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, bound: int) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """An oversized instance's (already split, each <= bound) transfers in order, cut into consecutive
    chunks whose per-rank staging fits the bound: ``(t_lo, t_hi, ranks, bytes per rank)`` each. Every
    instance of a unit shares its table, so this is computed once per unit."""
    chunks: list[tuple[int, int, dict[int, int]]] = []
    load: dict[int, int] = {}
    start = 0
    for t, (s, d, b) in enumerate(zip(src.tolist(), dst.tolist(), nbytes.tolist())):
        if load.get(s, 0) + b > bound or load.get(d, 0) + b > bound:
            chunks.append((start, t, load))
            load, start = {}, t
        load[s] = load.get(s, 0) + b
        load[d] = load.get(d, 0) + b
    if len(nbytes) > start:
        chunks.append((start, len(nbytes), load))
    return [(a, z, np.fromiter(ld.keys(), dtype=np.int64, count=len(ld)),
             np.fromiter(ld.values(), dtype=np.int64, count=len(ld))) for a, z, ld in chunks]
