"""Reading a rank's weights from a safetensors checkpoint: the ``CheckpointWeights`` weight source."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

import torch

from reshardctl.errors import ModelError
from reshardctl.layout.placement import Box
from reshardctl.models.checkpoint import read_json
from reshardctl.models.spec import ModelSpec
from reshardctl.runtime.dtypes import torch_dtype
from reshardctl.runtime.pinned_pool import shared_pool


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
            weight_map = read_json(path / "model.safetensors.index.json")["weight_map"]
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
        if torch.device(device).type == "cuda":
            out = shared_pool().to_device(out, device)  # one bounded pinned buffer, not a pinned block per box
        return out

    def close(self) -> None:
        self._stack.close()
        self._open.clear()
