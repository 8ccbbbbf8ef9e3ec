"""Weights a rank starts from: deterministic synthetic values, or slices of a safetensors checkpoint.

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
import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Mapping, Protocol

import torch

from reshardctl.errors import ModelError
from reshardctl.layout.placement import Box, box_shape
from reshardctl.models.spec import ModelSpec, TensorSpec
from reshardctl.runtime.pinned_pool import shared_pool

_MASK64 = (1 << 64) - 1
_K_IDX = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_ROWS_PER_CHUNK_ELEMS = 1 << 22  # generate at most ~4M elements at a time (bounds the int64 temporaries)


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _seed(name: str) -> int:
    return _signed(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def _step_mask(name: str, step: int) -> int:
    """A 64-bit pattern (unsigned) for (name, step); no byte is zero."""
    h = int.from_bytes(hashlib.blake2b(f"{name}@{step}".encode(), digest_size=8).digest(), "little")
    return h | 0x0101010101010101


def _width_mask(mask: int, width: int) -> int:
    """The low ``width`` bytes of ``mask`` as a signed integer of that width (a torch scalar)."""
    bits = 8 * width
    v = mask & ((1 << bits) - 1)
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ModelError(f"dtype {name!r} is not a torch dtype")
    return dt


def _norm_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape if shape else (1,)


def _norm_box(box: Box) -> Box:
    return box if box else ((0, 1),)


def _flat_indices(shape: tuple[int, ...], box: Box, device: torch.device) -> torch.Tensor:
    shape, box = _norm_shape(shape), _norm_box(box)
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
    x = idx.mul_(_signed(_K_IDX)).add_(seed)
    x = x.mul_(_signed(_M1)).bitwise_xor_((x >> 29) & ((1 << 35) - 1))
    return x.mul_(_signed(_M2)).bitwise_xor_(((x >> 32) & ((1 << 32) - 1)) ^ _signed(mask))


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
    nbox = _norm_box(box)
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


class WeightSource(Protocol):
    def region(self, index: int, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor: ...


class SyntheticWeights:
    """Deterministic synthetic weights of a model (the default source)."""

    kind = "synthetic"

    def __init__(self, model: ModelSpec):
        self.model = model

    def region(self, index: int, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return synthetic_region(self.model.tensors[index], box, step, device)


class CheckpointWeights:
    """Slices of a safetensors checkpoint (a file, or a directory with an index or several files).

    Each call reads only the requested box (``safe_open(...).get_slice(name)[a:b, c:d]``); ``step`` is
    ignored (a checkpoint is one step).
    """

    kind = "checkpoint"

    def __init__(self, model: ModelSpec, path: str | os.PathLike[str]):
        self.model = model
        self.path = Path(path)
        self._files = self._index(self.path)
        self._stack = ExitStack()
        self._open: dict[Path, object] = {}

    @staticmethod
    def _index(path: Path) -> Mapping[str, Path]:
        from safetensors import safe_open

        if path.is_file():
            files = [path]
        elif (path / "model.safetensors.index.json").is_file():
            weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
            return {k: path / v for k, v in weight_map.items()}
        elif path.is_dir():
            files = sorted(path.glob("*.safetensors"))
        else:
            raise ModelError(f"checkpoint {path} does not exist")
        out: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    out[k] = f
        if not out:
            raise ModelError(f"no safetensors tensors under {path}")
        return out

    def _handle(self, f: Path):
        from safetensors import safe_open

        h = self._open.get(f)
        if h is None:
            h = self._stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
            self._open[f] = h
        return h

    def region(self, index: int, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
        t = self.model.tensors[index]
        f = self._files.get(t.name)
        if f is None:
            raise ModelError(f"tensor {t.name} is not in checkpoint {self.path}")
        h = self._handle(f)
        if box:
            sl = h.get_slice(t.name)
            if tuple(sl.get_shape()) != t.shape:
                raise ModelError(f"{t.name}: checkpoint shape {tuple(sl.get_shape())} != model shape {t.shape}")
            out = sl[tuple(slice(a, b) for a, b in box)]
        else:
            out = h.get_tensor(t.name)
        if out.dtype != torch_dtype(t.dtype):
            raise ModelError(f"{t.name}: checkpoint dtype {out.dtype} != model dtype {t.dtype}")
        out = out.contiguous()
        if torch.device(device).type == "cuda":  # through one bounded pinned buffer, not a pinned block per box
            out = shared_pool().to_device(out, device)
        return out

    def close(self) -> None:
        self._stack.close()
        self._open.clear()


def check_checkpoint(model: ModelSpec, checkpoint: str | os.PathLike[str]) -> None:
    """Before any process starts: the checkpoint exists, its headers parse (headers only), and it holds
    every tensor of the model with the model's shape and dtype. Raises ``ModelError`` naming the path."""
    from reshardctl.models.checkpoint import read_safetensors_header

    path = Path(checkpoint)
    index = path / "model.safetensors.index.json"
    if path.is_file():
        files = [path]
    elif index.is_file():
        try:
            files = sorted({path / v for v in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"checkpoint index {index}: unreadable ({exc})") from exc
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelError(f"checkpoint {path}: no *.safetensors files in this directory")
    else:
        raise ModelError(f"checkpoint {path} does not exist")
    headers: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in files:
        headers.update(read_safetensors_header(f))
    problems = []
    for t in model.tensors:
        got = headers.get(t.name)
        if got is None:
            problems.append(f"{t.name}: missing")
        elif (got[0], tuple(got[1])) != (t.dtype, t.shape):
            problems.append(f"{t.name}: {got[0]} {list(got[1])} in the checkpoint, the model has {t.dtype} {list(t.shape)}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ModelError(f"checkpoint {checkpoint} does not match model {model.name}: " + "; ".join(problems[:5]) + more)


def weight_source(model: ModelSpec, checkpoint: str | None) -> WeightSource:
    return SyntheticWeights(model) if checkpoint is None else CheckpointWeights(model, checkpoint)


def materialise(
    model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]], step: int, *,
    source: WeightSource | None = None, device: torch.device | str = "cpu",
) -> dict[int, list[torch.Tensor]]:
    """One tensor per box of every held tensor, from ``source`` (synthetic by default)."""
    src = source if source is not None else SyntheticWeights(model)
    return {i: [src.region(i, b, step, device) for b in boxes] for i, boxes in holdings.items()}


def materialise_source(plan, train_rank: int, step: int, *, source: WeightSource | None = None,
                       device: torch.device | str = "cpu") -> dict[int, list[torch.Tensor]]:
    """A trainer rank's weights at ``step``: one tensor per box of ``plan.src_holdings(train_rank)``."""
    return materialise(plan.model, plan.src_holdings(train_rank), step, source=source, device=device)


def empty_like_holdings(model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]], *,
                        device: torch.device | str = "cpu", touch: bool = True) -> dict[int, list[torch.Tensor]]:
    """Uninitialised tensors for a holding (zeroed when ``touch``, so first use pays no page faults)."""
    out: dict[int, list[torch.Tensor]] = {}
    for i, boxes in holdings.items():
        dt = torch_dtype(model.tensors[i].dtype)
        ts = [torch.empty(box_shape(b), dtype=dt, device=device) for b in boxes]
        if touch:
            for t in ts:
                t.view(torch.uint8).zero_() if t.dim() else t.reshape(1).view(torch.uint8).zero_()
        out[i] = ts
    return out
