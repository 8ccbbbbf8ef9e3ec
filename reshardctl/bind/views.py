"""Where one box of an HF tensor sits in a framework parameter: the view arithmetic of a ``LocalSegment``.

``param[offset[0]:offset[0]+len0, ...]`` holds ``hf_name[box]``; a 3-D expert stack (vLLM ``w13_weight``,
``w2_weight``) has one more leading offset entry, the local expert slot: ``param[k, r0:r1, c0:c1]``.
"""

from __future__ import annotations

import torch

from reshardctl.layout.placement import LocalSegment, box_shape


def segment_index(seg: LocalSegment, ndim: int) -> tuple | None:
    """The index of ``seg``'s box in a parameter of ``ndim`` dimensions, or None when the offset has neither
    the box's rank nor one more (a layout bug)."""
    lens = box_shape(seg.box)
    lead = len(seg.offset) - len(lens)
    if lead not in (0, 1) or len(seg.offset) != ndim:
        return None
    inner = tuple(slice(o, o + n) for o, n in zip(seg.offset[lead:], lens))
    return ((seg.offset[0],) + inner) if lead else inner


def segment_problem(seg: LocalSegment, shape: tuple[int, ...]) -> str | None:
    """Why ``seg`` does not fit a parameter of ``shape`` (offset rank, or a range past the end), else None."""
    lens = box_shape(seg.box)
    lead = len(seg.offset) - len(lens)
    if lead not in (0, 1) or len(seg.offset) != len(shape):
        return (f"segment of {seg.hf_name} box {seg.box} in {seg.param}: offset {seg.offset} has {len(seg.offset)} "
                f"entries for a {len(shape)}-d parameter and a {len(lens)}-d box")
    ends = ((seg.offset[0] + 1,) if lead else ()) + tuple(o + n for o, n in zip(seg.offset[lead:], lens))
    if any(o < 0 for o in seg.offset) or any(e > s for e, s in zip(ends, shape)):
        return (f"segment of {seg.hf_name} box {seg.box} in {seg.param}: offset {seg.offset} + box shape {lens} "
                f"ends at {ends}, past the parameter's shape {shape}")
    return None


def segment_view(param: torch.Tensor, seg: LocalSegment) -> torch.Tensor:
    """The view of ``param`` (its storage, detached) that holds ``seg``'s box; check ``segment_problem`` first."""
    return param.detach()[segment_index(seg, param.dim())]
