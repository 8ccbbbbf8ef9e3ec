"""The plan: an immutable result of the planner, replayed at every refit.

A plan holds *units* (identical tensor instances that share one transfer table), *rounds* (global,
bounded p2p batches that reference slices of units) and, for gather-and-broadcast / hybrid,
*broadcast buckets*. Per-rank step lists (``steps_for``) are materialised on demand, so a plan for
DeepSeek-V3 on 512 GPUs never holds millions of Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from reshardctl.layout.placement import Box
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.rank_steps import p2p_steps
from reshardctl.plan.rounds import Round
from reshardctl.plan.routing import TransferTable
from reshardctl.plan.schedule import BroadcastBucket, Step
from reshardctl.topology import Topology, infer_rank_of, is_trainer

TRANSPORTS = ("reshard", "gather_broadcast", "hybrid")
# Roles the hybrid transport reshards (the dominant bytes); everything else is broadcast.
HYBRID_RESHARD_ROLES = frozenset({"ffn", "expert"})


@dataclass(frozen=True)
class Unit:
    """``len(tensors)`` instances of the same transfer table (one stage)."""

    tensors: np.ndarray  # int32 tensor indices
    table: TransferTable
    stage: int
    itemsize: int


def _holdings(model: ModelSpec, layout: SideLayout, rank: int) -> dict[int, tuple[Box, ...]]:
    """Tensor index -> the boxes ``rank`` (numbered within ``layout``'s side) holds, for the tensors it
    holds: one lookup per placement class (a few hundred), not per tensor (90k for DeepSeek-V3)."""
    classes, reps = layout.placement_classes()
    per_class = [rep.holding(rank) for rep in reps]
    held = np.nonzero(np.fromiter((bool(b) for b in per_class), dtype=bool, count=len(per_class)))[0]
    if held.size == 0:
        return {}
    idx = np.nonzero(np.isin(classes, held))[0]
    return {i: per_class[c] for i, c in zip(idx.tolist(), classes[idx].tolist())}


@dataclass(frozen=True)
class Plan:
    transport: str
    model: ModelSpec
    train: SideLayout
    infer: SideLayout
    topology: Topology
    bucket_bytes: int
    relay: bool
    units: tuple[Unit, ...]
    rounds: tuple[Round, ...]
    buckets: tuple[BroadcastBucket, ...]
    fingerprint: str = ""
    planning_s: float = field(default=0.0, compare=False)

    @property
    def train_world(self) -> int:
        return self.topology.train_world

    @property
    def infer_world(self) -> int:
        return self.topology.infer_world

    @property
    def world(self) -> int:
        return self.topology.world

    # ---- per-rank views (what the runtime executes) ------------------------------------------
    def src_holdings(self, train_rank: int) -> dict[int, tuple[Box, ...]]:
        return _holdings(self.model, self.train, train_rank)

    def dst_holdings(self, infer_rank: int) -> dict[int, tuple[Box, ...]]:
        return _holdings(self.model, self.infer, infer_rank)

    def boxes_of(self, rank: int, tensor: int) -> tuple[Box, ...]:
        """The boxes of one tensor a global rank holds (a peer's holding, looked up tensor by tensor;
        cached per placement class and rank, so a rank's program pays per class, not per tensor)."""
        cache = self.__dict__.get("_boxes_of")
        if cache is None:
            sides = []
            for side in (self.train, self.infer):
                classes, reps = side.placement_classes()
                sides.append((classes.tolist(), reps))
            cache = self.__dict__["_boxes_of"] = ({}, sides)
        memo, sides = cache
        T = self.train_world
        s, r = (0, rank) if is_trainer(rank, T) else (1, infer_rank_of(rank, T))
        classes, reps = sides[s]
        c = classes[tensor]
        key = (rank, c) if s == 0 else (rank, -1 - c)
        got = memo.get(key)
        if got is None:
            got = memo[key] = reps[c].holding(r)
        return got

    def broadcast_groups(self) -> list[tuple[int, ...]]:
        """Every distinct broadcast group (sorted members), in a fixed order: every rank creates the
        same sub-communicators in the same order from this alone. Each group object of the buckets is
        sorted once (thousands of buckets share a few hundred: DeepSeek-V3's 11k buckets share 256: 0.027 -> 0.002 s)."""
        by_object = {id(b.group): b.group for b in self.buckets}
        return sorted({tuple(sorted(g)) for g in by_object.values()})

    def steps_for(self, rank: int) -> list[Step]:
        """Ordered steps of one global rank; every step index appears on every rank that takes part."""
        steps: list[Step] = list(p2p_steps(self.units, self.rounds, rank))
        for b in self.buckets:
            if rank in b.group or any(g.peer == rank for g in b.gather):
                steps.append(b)
        return steps

    def iter_transfers(self) -> Iterator[tuple[int, int, int, Box, int, int]]:
        """Every p2p transfer as (tensor index, src, dst, box, nbytes, stage), in round order.
        Streams (one tuple at a time) for ``--export-transfers``."""
        for rnd in self.rounds:
            for e in rnd.records():
                unit = self.units[e.unit]
                tab = unit.table
                lo, hi = tab.lo[e.t_lo : e.t_hi].tolist(), tab.hi[e.t_lo : e.t_hi].tolist()
                src, dst = tab.src[e.t_lo : e.t_hi].tolist(), tab.dst[e.t_lo : e.t_hi].tolist()
                nb = tab.nbytes[e.t_lo : e.t_hi].tolist()
                for inst in unit.tensors[e.inst_lo : e.inst_hi].tolist():
                    for k in range(len(src)):
                        yield inst, src[k], dst[k], tuple(zip(lo[k], hi[k])), nb[k], rnd.stage

    @property
    def num_transfers(self) -> int:
        """p2p transfers per refit: instances x transfer rows, summed over every round entry (counted once)."""
        got = self.__dict__.get("_num_transfers")
        if got is None:
            got = sum(int(((e[:, 2] - e[:, 1]) * (e[:, 4] - e[:, 3])).sum()) for e in (r.entries for r in self.rounds))
            self.__dict__["_num_transfers"] = got
        return got
