"""A rank's arena: every box it holds back to back in one flat buffer, in the order its program first
uses them (then the rest by tensor index), each box aligned to its element size.

Ordering boxes by first use makes the regions of one link (one message, wire.py) neighbours in
memory wherever the plan allows: an inference rank that receives whole boxes lays them out in arrival
order, so every such message lands in place (zero copy); a trainer whose links take whole boxes sends
them in place. The order is a function of the rank's own program; peers never need it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from reshardctl.layout.placement import Box, box_numel
from reshardctl.models.spec import ModelSpec


def box_bytes(model: ModelSpec, tensor: int, box: Box) -> int:
    return box_numel(box) * model.tensors[tensor].itemsize  # a scalar's empty box holds one element


def arena_offsets(model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]],
                  order: Iterable[tuple[int, int]] = ()) -> tuple[dict[tuple[int, int], int], int]:
    """Byte offset of every (tensor, box number): those in ``order`` first, in that order, then the
    others by tensor index; each box starts at a multiple of its element size. Returns (offsets, size)."""
    offsets: dict[tuple[int, int], int] = {}
    off = 0

    def place(key: tuple[int, int]) -> None:
        nonlocal off
        i, k = key
        isz = model.tensors[i].itemsize
        off = -(-off // isz) * isz
        offsets[key] = off
        off += box_bytes(model, i, holdings[i][k])

    for key in order:
        if key not in offsets and key[0] in holdings and key[1] < len(holdings[key[0]]):
            place(key)
    for i in sorted(holdings):
        for k in range(len(holdings[i])):
            if (i, k) not in offsets:
                place((i, k))
    return offsets, -(-off // 8) * 8
