"""Where one box of an HF tensor sits in a framework parameter: the view arithmetic of a ``LocalSegment``.

``param[offset[0]:offset[0]+len0, ...]`` holds ``hf_name[box]``; a 3-D expert stack (vLLM ``w13_weight``,
``w2_weight``) has one more leading offset entry, the local expert slot: ``param[k, r0:r1, c0:c1]``.
"""

from __future__ import annotations

from reshardctl.layout.placement import LocalSegment


def segment_index(seg: LocalSegment, shape: tuple[int, ...]) -> tuple | str:
    """The index of ``seg``'s box in a parameter of ``shape`` (``param.detach()[index]`` is its view), or
    why it does not fit (an offset of the wrong rank, a range past the end: a layout bug) as a string."""
    box, offset = seg.box, seg.offset
    lead = len(offset) - len(box)
    if lead not in (0, 1) or len(offset) != len(shape):
        return (f"segment of {seg.hf_name} box {box} in {seg.param}: offset {offset} has {len(offset)} "
                f"entries for a {len(shape)}-d parameter and a {len(box)}-d box")
    index = [offset[0]] if lead else []
    fits = not lead or 0 <= offset[0] < shape[0]
    for (a, b), o, n in zip(box, offset[lead:], shape[lead:]):
        e = o + max(0, b - a)
        fits = fits and 0 <= o and e <= n
        index.append(slice(o, e))
    if not fits:
        return (f"segment of {seg.hf_name} box {box} in {seg.param}: offset {offset} + the box's extent "
                f"goes past the parameter's shape {shape}")
    return tuple(index)
