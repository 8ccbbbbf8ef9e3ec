"""Real sharded HF checkpoints (zeros) written from a ModelSpec."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from reshardctl.models.spec import ModelSpec


def write_checkpoint(spec: ModelSpec, root: Path, *, shards: int = 3, config: dict | None = None) -> Path:
    """Write ``spec`` as a real sharded HF checkpoint (zeros) with index and config.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(dict(config if config is not None else spec.config)))
    total = spec.num_bytes
    groups: list[list] = [[] for _ in range(shards)]
    for i, t in enumerate(spec.tensors):  # contiguous runs of tensors, in checkpoint order
        groups[i * shards // len(spec.tensors)].append(t)
    weight_map = {}
    for k, group in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file({t.name: torch.zeros(t.shape, dtype=getattr(torch, t.dtype)) for t in group},
                  str(root / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys((t.name for t in group), file))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return root / "model.safetensors.index.json"
