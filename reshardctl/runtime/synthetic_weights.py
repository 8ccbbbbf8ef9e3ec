"""Deterministic synthetic weights (the default weight source).

Synthetic: the bit pattern of element ``i`` (flat, row-major, global index) of tensor ``name`` at
training step ``s`` is ``mix(i * K + seed(name)) XOR mask(name, s)``, cut to the dtype's width (the
step mask has no zero byte, so every element differs from the previous step's). A trainer moves its
weights to the next step with one in-place XOR (``restep_``) instead of regenerating them. Any rank can
regenerate any region of any tensor for any step on its own, which is what the tests and the
whole-model check compare against. Values are raw bit patterns (NaN/Inf patterns included for float
dtypes); only bytes are compared.
"""

from __future__ import annotations

import hashlib

import torch

from reshardctl.errors import ModelError
from reshardctl.layout.placement import Box, box_shape, norm_box
from reshardctl.models.spec import ModelSpec, TensorSpec
from reshardctl.runtime.dtypes import signed64, torch_dtype

_K_IDX = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_ROWS_PER_CHUNK_ELEMS = 1 << 22  # generate at most ~4M elements at a time (bounds the int64 temporaries)


def _seed(name: str) -> int:
    return signed64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def _step_mask(name: str, step: int) -> int:
    """A 64-bit pattern (unsigned) for (name, step); no byte is zero."""
    h = int.from_bytes(hashlib.blake2b(f"{name}@{step}".encode(), digest_size=8).digest(), "little")
    return h | 0x0101010101010101


def _width_mask(mask: int, width: int) -> int:
    """The low ``width`` bytes of ``mask`` as a signed integer of that width (a torch scalar)."""
    bits = 8 * width
    v = mask & ((1 << bits) - 1)
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _flat_indices(shape: tuple[int, ...], box: Box, device: torch.device) -> torch.Tensor:
    shape, box = (shape if shape else (1,)), norm_box(box)
    idx = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    nd = len(shape)
    for d in range(nd - 1, -1, -1):
        a, b = box[d]
        view = [1] * nd
        view[d] = b - a
        idx = idx + (torch.arange(a, b, dtype=torch.int64, device=device) * stride).view(view)
        stride *= shape[d]
    return idx


def _bits(idx: torch.Tensor, seed: int, mask: int) -> torch.Tensor:
    x = idx.mul_(signed64(_K_IDX)).add_(seed)
    x = x.mul_(signed64(_M1)).bitwise_xor_((x >> 29) & ((1 << 35) - 1))
    return x.mul_(signed64(_M2)).bitwise_xor_(((x >> 32) & ((1 << 32) - 1)) ^ signed64(mask))


def _cut(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    width = torch.empty((), dtype=dtype).element_size()
    if dtype == torch.bool:
        return (x & 1).to(torch.bool)  # the step mask's low bit is always 1
    if width == 8:
        return x.view(dtype)
    if width == 4:
        return ((x & 0xFFFFFFFF) - ((x >> 31 & 1) << 32)).to(torch.int32).view(dtype)
    if width == 2:
        return ((x & 0xFFFF) - ((x >> 15 & 1) << 16)).to(torch.int16).view(dtype)
    if width == 1:
        return (x & 0xFF).to(torch.uint8).view(dtype)
    raise ModelError(f"no synthetic values for dtype {dtype}")


def synthetic_region(t: TensorSpec, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Synthetic values of ``t[box]`` at ``step``: a new contiguous tensor of the box's shape."""
    device = torch.device(device)
    dtype = torch_dtype(t.dtype)
    shape = box_shape(box)
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel() == 0:
        return out
    seed, mask = _seed(t.name), _step_mask(t.name, step)
    flat = out.view(-1) if out.dim() else out.view(1)
    nbox = norm_box(box)
    row_elems = max(1, flat.numel() // max(1, nbox[0][1] - nbox[0][0]))
    rows = max(1, _ROWS_PER_CHUNK_ELEMS // row_elems)
    a0, b0 = nbox[0]
    for r in range(a0, b0, rows):
        sub = ((r, min(b0, r + rows)),) + tuple(nbox[1:])
        vals = _cut(_bits(_flat_indices(t.shape, sub if box else (), device), seed, mask), dtype).reshape(-1)
        lo = (r - a0) * row_elems
        flat[lo : lo + vals.numel()].copy_(vals)
    return out


def _int_view(t: torch.Tensor) -> torch.Tensor:
    t = t if t.dim() else t.reshape(1)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def restep_(t: TensorSpec, data: torch.Tensor, from_step: int, to_step: int) -> torch.Tensor:
    """Turn synthetic ``t`` data (any box) of ``from_step`` into ``to_step``'s, in place."""
    if from_step == to_step or data.numel() == 0:
        return data
    delta = _step_mask(t.name, from_step) ^ _step_mask(t.name, to_step)
    if data.dtype == torch.bool:
        if delta & 1:
            data.logical_not_()
        return data
    w = data.element_size()
    v = _int_view(data)
    v.bitwise_xor_(_width_mask(delta, w) if w > 1 else delta & 0xFF)
    return data


class SyntheticWeights:
    """Deterministic synthetic weights of a model (the default source)."""

    kind = "synthetic"

    def __init__(self, model: ModelSpec):
        self.model = model

    def region(self, index: int, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return synthetic_region(self.model.tensors[index], box, step, device)
