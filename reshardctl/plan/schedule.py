"""What one rank executes: the per-rank view of a plan, as small immutable step records.

Ranks are *global*: trainer rank ``r`` is ``r``; inference rank ``r`` is ``train_world + r``.
A plan produces, for every global rank, an ordered list of steps; every rank walks its list in order,
and the steps of all ranks with the same ``index`` are matched (same round, same broadcast bucket), so
no rank waits on a step another rank has not reached.

Regions are boxes in the HF tensor's global coordinates; bytes travel packed, in region order,
row-major inside each box, as raw bytes (uint8) whatever the tensor dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from reshardctl.layout.placement import Box


class Region(NamedTuple):
    """A box of one tensor, moved as ``nbytes`` bytes. (A named tuple: the gather-and-broadcast plan of
    DeepSeek-V3 has 45k of them and a rank's steps tens of thousands, and a frozen dataclass costs
    several times as much to build.)"""

    tensor: int  # index into ModelSpec.tensors
    box: Box  # global coordinates
    nbytes: int


@dataclass(frozen=True, slots=True)
class PeerRegions:
    peer: int  # global rank of the other side
    regions: tuple[Region, ...]  # packed in this order

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.regions)


@dataclass(frozen=True, slots=True)
class P2PRound:
    """One batched set of point-to-point operations.

    ``stage`` 1: senders are trainer ranks and read their training weights.
    ``stage`` 2: senders are inference relays and read the *new* (staged) copy they received in an
    earlier stage-1 round (the two-stage fan-out inside an NVLink domain).
    Receivers always write into their staged (not yet committed) inference weights.
    """

    index: int
    stage: int
    sends: tuple[PeerRegions, ...]
    recvs: tuple[PeerRegions, ...]

    @property
    def staging_bytes(self) -> int:
        return sum(p.nbytes for p in self.sends) + sum(p.nbytes for p in self.recvs)


@dataclass(frozen=True, slots=True)
class BroadcastBucket:
    """Gather-and-broadcast, one packed bucket.

    1. Gather: every trainer rank in ``gather`` sends its pieces to ``root`` (the stage leader), which
       places them into the bucket (``root``'s own pieces are copied locally).
    2. Broadcast the bucket from ``root`` over ``group`` (root first, then every inference rank).
    3. Every inference rank unpacks the boxes it holds from the bucket into its staged weights.

    The bucket is the concatenation of ``tensors`` (full HF tensors, row-major) in order.
    """

    index: int
    root: int
    group: tuple[int, ...]
    tensors: tuple[int, ...]  # tensor indices, full tensors, packed in this order
    gather: tuple[PeerRegions, ...]  # (trainer rank, its pieces of these tensors) incl. root itself
    nbytes: int  # bucket size = sum of the full tensors' bytes


Step = P2PRound | BroadcastBucket
