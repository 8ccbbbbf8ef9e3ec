"""What every planning step consumes: for one HF tensor on one side, which rank holds which boxes.

A *box* is a half-open interval per dimension in the HF tensor's global coordinates:
``((r0, r1), (c0, c1))`` = rows ``[r0, r1)`` x columns ``[c0, c1)``.

A *holding* is the tuple of disjoint boxes one rank holds of one tensor, in a fixed order.
Its local data is one tensor per box (of the box's shape); those may be views into a fused framework
parameter (see ``LocalSegment``), which is how a Megatron ``linear_qkv`` rank holds interleaved q/k/v rows.

A ``ShardTemplate`` is the split of one shape over ``n`` slots; it does not know ranks, so the thousands
of expert tensors that split the same way share one template object (layouts intern them). A
``Placement`` pins a template to side-local ranks: slot ``i`` lives on ``ranks[i]``. Slots with identical
holdings are replicas (data-parallel copies, replicated norms, replicated KV heads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Iterator

Interval = tuple[int, int]
Box = tuple[Interval, ...]


def box_numel(box: Box) -> int:
    return prod(max(0, b - a) for a, b in box)


def box_shape(box: Box) -> tuple[int, ...]:
    return tuple(max(0, b - a) for a, b in box)


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def norm_box(box: Box) -> Box:
    """A 0-d tensor's box ``()`` as the one-element box ``((0, 1),)``; any other box unchanged."""
    return box if box else ((0, 1),)


@dataclass(frozen=True)
class ShardTemplate:
    """The split of one global shape over slots. Immutable and hashable; interned by layouts."""

    shape: tuple[int, ...]
    holdings: tuple[tuple[Box, ...], ...]  # per slot; a slot may hold nothing (empty tuple)

    @property
    def num_slots(self) -> int:
        return len(self.holdings)

    def slot_numel(self, slot: int) -> int:
        return sum(box_numel(b) for b in self.holdings[slot])

    def slot_numels(self):
        """``slot_numel`` of every slot, as a read-only int64 array; computed once per template (the
        plans of one command read it for every placement class of a layout)."""
        cached = self.__dict__.get("_slot_numels")
        if cached is None:
            import numpy as np

            cached = np.fromiter((self.slot_numel(s) for s in range(self.num_slots)), dtype=np.int64,
                                 count=self.num_slots)
            cached.flags.writeable = False
            object.__setattr__(self, "_slot_numels", cached)
        return cached

    def replica_classes(self) -> tuple[tuple[int, ...], ...]:
        """Groups of slots with identical holdings, in order of first appearance; empty slots dropped."""
        cached = self.__dict__.get("_replica_classes")
        if cached is None:
            groups: dict[tuple[Box, ...], list[int]] = {}
            for i, h in enumerate(self.holdings):
                if h:
                    groups.setdefault(h, []).append(i)
            cached = tuple(tuple(v) for v in groups.values())
            object.__setattr__(self, "_replica_classes", cached)
        return cached


@dataclass(frozen=True)
class Placement:
    """A template pinned to side-local ranks (``ranks[i]`` holds slot ``i``)."""

    template: ShardTemplate
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ranks) != self.template.num_slots:
            raise ValueError(f"placement has {len(self.ranks)} ranks for {self.template.num_slots} slots")

    def holding(self, rank: int) -> tuple[Box, ...]:
        """Boxes held by a side-local rank (union over its slots; normally one slot per rank)."""
        out: list[Box] = []
        for slot, r in enumerate(self.ranks):
            if r == rank:
                out.extend(self.template.holdings[slot])
        return tuple(out)

    def items(self) -> Iterator[tuple[int, tuple[Box, ...]]]:
        for slot, r in enumerate(self.ranks):
            yield r, self.template.holdings[slot]


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """Where one box of an HF tensor sits in a framework parameter on one rank.

    ``param[offset[0]:offset[0]+len0, offset[1]:offset[1]+len1, ...]`` holds ``hf_name[box]``.
    """

    hf_name: str
    box: Box
    param: str
    offset: tuple[int, ...]


@dataclass(frozen=True)
class LocalParam:
    """A framework parameter on one rank (fused or not). Rows not covered by segments are padding.
    ``buffer``: the framework registers it as a buffer (``register_buffer``), not as an ``nn.Parameter``
    (Megatron's router ``expert_bias``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    segments: tuple[LocalSegment, ...] = field(default=())
    buffer: bool = False
