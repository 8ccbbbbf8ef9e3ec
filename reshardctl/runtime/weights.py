"""A rank's weight tensors: the ``WeightSource`` protocol, choosing a source (synthetic or checkpoint),
materialising a holding from a source, and allocating an empty holding.

The sources live in ``synthetic_weights.py`` (deterministic synthetic values, the default) and
``checkpoint_weights.py`` (slices of a safetensors checkpoint); ``checkpoint_check.py`` checks a
checkpoint against the model before any rank starts.
"""

from __future__ import annotations

from typing import Mapping, Protocol

import torch

from reshardctl.layout.placement import Box, box_shape
from reshardctl.models.spec import ModelSpec
from reshardctl.runtime.checkpoint_weights import CheckpointWeights
from reshardctl.runtime.dtypes import torch_dtype
from reshardctl.runtime.synthetic_weights import SyntheticWeights


class WeightSource(Protocol):
    def region(self, index: int, box: Box, step: int, device: torch.device | str = "cpu") -> torch.Tensor: ...


def weight_source(model: ModelSpec, checkpoint: str | None) -> WeightSource:
    return SyntheticWeights(model) if checkpoint is None else CheckpointWeights(model, checkpoint)


def materialise(
    model: ModelSpec, holdings: Mapping[int, tuple[Box, ...]], step: int, *,
    source: WeightSource | None = None, device: torch.device | str = "cpu",
) -> dict[int, list[torch.Tensor]]:
    """One tensor per box of every held tensor, from ``source`` (synthetic by default)."""
    src = source if source is not None else SyntheticWeights(model)
    return {i: [src.region(i, b, step, device) for b in boxes] for i, boxes in holdings.items()}


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
