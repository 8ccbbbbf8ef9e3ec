"""One rank's weights of several tensors: per tensor index, its boxes and one tensor per box.

Weights the runtime allocates itself (synthetic or checkpoint sources, the staged and current
inference copies) live in one **arena**: a flat uint8 buffer holding every box back to back in the
order the rank's program first uses them (``arena.py``), each box a view into it, so a link's regions
are usually one contiguous range and travel as one zero-copy message (wire.py). Weights handed over
by an RL framework (the API) have no arena: each box is the framework's own tensor, and their
messages go through staging.

Copies go through uint8 views of the box tensors, so any dtype, any alignment and any box works;
torch turns them into row-wise memcpy.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch

from reshardctl.errors import TransferError
from reshardctl.layout.indexset import intersect_boxes
from reshardctl.layout.placement import Box, box_numel, box_shape
from reshardctl.models.spec import ModelSpec
from reshardctl.runtime.arena import arena_offsets
from reshardctl.runtime.dtypes import torch_dtype

def norm_box(box: Box) -> Box:
    """A scalar's empty box as the one-element box ``((0, 1),)``."""
    return box if box else ((0, 1),)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """uint8 view of a tensor whose last dim is contiguous: shape (..., last * itemsize)."""
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8)


def byte_slices(inner: Box, origin: Box, itemsize: int) -> tuple[slice, ...]:
    """Slices of ``inner`` inside a byte view of the box ``origin`` (last dim in bytes)."""
    sl = [slice(a - o, b - o) for (a, b), (o, _) in zip(inner, origin)]
    last = sl[-1]
    sl[-1] = slice(last.start * itemsize, last.stop * itemsize)
    return tuple(sl)


def byte_shape(box: Box, itemsize: int) -> tuple[int, ...]:
    shape = list(box_shape(norm_box(box)))
    shape[-1] *= itemsize
    return tuple(shape)


class LocalWeights:
    """One rank's data of several tensors: for every tensor index, its boxes and one tensor per box;
    ``arena`` (1-D uint8) and ``box_offset`` when the boxes are views of one arena (``in_arena``)."""

    def __init__(self, model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]],
                 data: Mapping[int, list[torch.Tensor]], *, arena: torch.Tensor | None = None,
                 box_offset: Mapping[tuple[int, int], int] | None = None):
        self.model = model
        self.boxes = {i: tuple(b) for i, b in holdings.items()}
        self.data = {i: list(data[i]) for i in self.boxes}
        self.arena = arena
        self.box_offset = dict(box_offset or {})
        for i, boxes in self.boxes.items():
            ts = self.data[i]
            if len(ts) != len(boxes):
                raise TransferError(f"{model.tensors[i].name}: {len(ts)} local tensors for {len(boxes)} boxes")
            for b, t in zip(boxes, ts):
                if tuple(t.shape) != box_shape(b):
                    raise TransferError(f"{model.tensors[i].name}: local tensor {tuple(t.shape)} for box {b}")
        self._pieces: dict[tuple[int, Box], tuple[tuple[int, Box], ...]] = {}

    @classmethod
    def in_arena(cls, model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]], device: torch.device | str,
                 fill: Callable[[int, Box], torch.Tensor] | None = None, *, order: Iterable[tuple[int, int]] = (),
                 touch: bool = True) -> "LocalWeights":
        """Weights in one arena, boxes in ``order`` (the program's first use, ``arena.py``) then the
        rest; every box filled from ``fill(tensor, box)`` when given, else zeroed when ``touch`` (so the
        first refit pays no page faults)."""
        offsets, size = arena_offsets(model, holdings, order)
        arena = (torch.zeros if touch or fill is not None else torch.empty)(max(size, 8), dtype=torch.uint8,
                                                                            device=device)
        data: dict[int, list[torch.Tensor]] = {}
        for i, boxes in holdings.items():
            t = model.tensors[i]
            dt = torch_dtype(t.dtype)
            views = []
            for k, b in enumerate(boxes):
                off = offsets[(i, k)]
                n = box_numel(b) * t.itemsize
                v = arena[off : off + n].view(dt).view(box_shape(b))
                if fill is not None:
                    v.copy_(fill(i, b))
                views.append(v)
            data[i] = views
        return cls(model, holdings, data, arena=arena, box_offset=offsets)

    def alias(self) -> "LocalWeights":
        """Another LocalWeights over the same boxes and tensors, in O(1): the dicts are shared, nothing is
        checked or copied again. ``swap_data`` reassigns attributes (it never changes a dict), so
        swapping the alias leaves this object as it is (api.py keeps the caller's checked tensors so)."""
        other = object.__new__(LocalWeights)
        other.__dict__.update(self.__dict__)
        return other

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.data.values() for t in ts)

    def pieces(self, index: int, box: Box) -> tuple[tuple[int, Box], ...]:
        """(local box number, intersection) for every local box overlapping ``box``; must cover it."""
        key = (index, box)
        got = self._pieces.get(key)
        if got is None:
            nb = norm_box(box)
            out = []
            for k, lb in enumerate(self.boxes.get(index, ())):
                inter = intersect_boxes(norm_box(lb), nb)
                if inter is not None:
                    out.append((k, inter))
            covered = sum(box_numel(i) for _, i in out)
            if covered != box_numel(nb):
                name = self.model.tensors[index].name
                raise TransferError(
                    f"{name} {box}: this rank holds {covered} of its {box_numel(nb)} elements"
                    f" (boxes {self.boxes.get(index, ())})"
                )
            got = tuple(out)
            self._pieces[key] = got
        return got

    def _shaped(self, index: int, box: Box, buf: torch.Tensor) -> torch.Tensor:
        shape = byte_shape(box, self.model.tensors[index].itemsize)
        if tuple(buf.shape) == shape:
            return buf
        return buf.view(shape)

    def piece_views(self, index: int, box: Box, buf: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(view of ``buf``, view of the local tensor) for every local piece of ``tensor[index][box]``
        (global coordinates); ``buf`` is a flat uint8 segment of the box's bytes (row-major) or a uint8
        view already shaped like the box (last dim in bytes)."""
        isz = self.model.tensors[index].itemsize
        nb = norm_box(box)
        view = self._shaped(index, box, buf)
        return [(view[byte_slices(inter, nb, isz)],
                 byte_view(self.data[index][k])[byte_slices(inter, norm_box(self.boxes[index][k]), isz)])
                for k, inter in self.pieces(index, box)]

    def read_into(self, index: int, box: Box, dst: torch.Tensor) -> None:
        """Copy ``tensor[index][box]`` (global coordinates) into ``dst`` (as in ``piece_views``)."""
        for d, s in self.piece_views(index, box, dst):
            d.copy_(s)

    def write_from(self, index: int, box: Box, src: torch.Tensor) -> None:
        """Copy ``tensor[index][box]`` from ``src`` (flat segment or shaped view) into the local tensors."""
        for v, mine in self.piece_views(index, box, src):
            mine.copy_(v)

    def swap_data(self, other: "LocalWeights") -> None:
        """Exchange tensors (and arenas) with ``other`` (same holdings): the commit's pointer swap."""
        if self.boxes != other.boxes:
            raise TransferError("cannot swap weights of different holdings")
        self.data, other.data = other.data, self.data
        self.arena, other.arena = other.arena, self.arena
        self.box_offset, other.box_offset = other.box_offset, self.box_offset
