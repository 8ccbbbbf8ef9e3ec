"""Modules for the binding tests: an ``nn.Module`` whose ``named_parameters()`` (and ``named_buffers()``)
are exactly a given ``{name: tensor}``, nested at the dots as a framework's modules are; and plans of the
small test models (tests/helpers/parallel_models.py) for given trainer and inference layouts."""

from __future__ import annotations

import torch

from reshardctl.layout.build import build_layout
from reshardctl.plan.planner import build_plan
from reshardctl.topology import Topology


def module_of(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor] | None = None,
              requires_grad: bool = True) -> torch.nn.Module:
    """A module tree holding ``params`` as ``nn.Parameter``s and ``buffers`` as buffers, under their names."""
    root = torch.nn.Module()

    def parent(name: str) -> tuple[torch.nn.Module, str]:
        *path, leaf = name.split(".")
        m = root
        for p in path:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        return m, leaf

    for name, t in params.items():
        m, leaf = parent(name)
        m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=requires_grad and t.is_floating_point()))
    for name, t in (buffers or {}).items():
        m, leaf = parent(name)
        m.register_buffer(leaf, t)
    return root


def zeros_of(layout, rank: int) -> dict[str, torch.Tensor]:
    """A zero tensor of every framework parameter ``layout`` puts on ``rank`` (its name, shape, dtype)."""
    return {lp.name: torch.zeros(lp.shape, dtype=getattr(torch, lp.dtype)) for lp in layout.local_params(rank)}


def small_plan(model, train: str, infer: str, train_style: str = "megatron", infer_style: str = "vllm",
               transport: str = "reshard"):
    tl = build_layout(model, "train", train, train_style)
    il = build_layout(model, "infer", infer, infer_style)
    return build_plan(model, tl, il, Topology(tl.world_size, il.world_size, 8, 8), transport=transport,
                      bucket_bytes=1 << 20, relay=False)
