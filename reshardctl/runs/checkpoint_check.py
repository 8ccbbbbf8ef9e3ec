"""Checking a safetensors checkpoint against the model before any rank starts (headers only)."""

from __future__ import annotations

import os
from pathlib import Path

from reshardctl.errors import ModelError
from reshardctl.models.spec import ModelSpec


def check_checkpoint(model: ModelSpec, checkpoint: str | os.PathLike[str]) -> None:
    """Before any process starts: the checkpoint exists, its headers parse (headers only), and it holds
    every tensor of the model with the model's shape and dtype. Raises ``ModelError`` naming the path."""
    from reshardctl.models.checkpoint import read_json, read_safetensors_header

    path = Path(checkpoint)
    index = path / "model.safetensors.index.json"
    if path.is_file():
        files = [path]
    elif index.is_file():
        weight_map = read_json(index).get("weight_map")  # bounded, regular files only
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelError(f"checkpoint index {index}: key 'weight_map' must map tensor names to file names")
        files = sorted({path / v for v in weight_map.values()})
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
