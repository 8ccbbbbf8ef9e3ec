"""Bucketing: pack transfers into global rounds whose staging memory per rank stays within a bound.

Staging of a rank in a round = bytes it packs to send + bytes it receives. Work arrives as *units*:
``count`` identical tensor instances, each with the same per-rank load vector, so tens of thousands of
expert tensors cost one numpy step each, not one Python object per transfer. A unit whose single
instance exceeds the bound on some rank is split into pieces (``split_box``) and packed transfer by
transfer. Greedy first-fit in model order: simple, deterministic, and the bound holds by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Entry:
    """A slice of a unit inside a round: instances ``[inst_lo, inst_hi)``, transfers ``[t_lo, t_hi)``."""

    unit: int
    inst_lo: int
    inst_hi: int
    t_lo: int
    t_hi: int


@dataclass(frozen=True)
class Round:
    index: int
    stage: int
    entries: tuple[Entry, ...]


class RoundPacker:
    """Accumulates entries into rounds for one stage; ``close()`` ends the current round."""

    def __init__(self, world: int, bound: int, stage: int, first_index: int):
        self.bound = bound
        self.stage = stage
        self.load = np.zeros(world, dtype=np.int64)
        self.entries: list[Entry] = []
        self.rounds: list[Round] = []
        self.loads: list[np.ndarray] = []  # staging per rank of each closed round
        self.next_index = first_index

    def close(self) -> None:
        if self.entries:
            self.rounds.append(Round(self.next_index, self.stage, tuple(self.entries)))
            self.loads.append(self.load.copy())
            self.next_index += 1
        self.entries = []
        self.load[:] = 0

    def add_unit(self, unit: int, load: np.ndarray, count: int, n_transfers: int) -> None:
        """``count`` instances of a unit whose per-instance staging vector is ``load`` (max <= bound)."""
        nz = np.nonzero(load)[0]
        v = load[nz]
        pos = 0
        while pos < count:
            room = (self.bound - self.load[nz]) // v
            k = int(min(room.min(), count - pos)) if nz.size else count - pos
            if k <= 0:
                self.close()
                continue
            self.load[nz] += k * v
            self.entries.append(Entry(unit, pos, pos + k, 0, n_transfers))
            pos += k

    def add_pieces(self, unit: int, inst: int, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> None:
        """One oversized instance, transfer by transfer (each transfer already <= bound)."""
        start = 0
        for t in range(len(nbytes)):
            s, d, b = int(src[t]), int(dst[t]), int(nbytes[t])
            if self.load[s] + b > self.bound or self.load[d] + b > self.bound:
                if t > start:
                    self.entries.append(Entry(unit, inst, inst + 1, start, t))
                    start = t
                self.close()
            self.load[s] += b
            self.load[d] += b
        if len(nbytes) > start:
            self.entries.append(Entry(unit, inst, inst + 1, start, len(nbytes)))
