"""Byte-for-byte checks of the weights the inference ranks dumped (``--dump-weights``) against the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import torch

from reshardctl.runtime.checksum import checksum
from reshardctl.runtime.synthetic_weights import synthetic_region


def u8(t):
    """The bytes of ``t``, flat."""
    return (t.reshape(1) if t.dim() == 0 else t).view(torch.uint8).reshape(-1)


def assert_previous_weights(run_dir, plan, step: int, ranks) -> None:
    """Every listed inference rank holds exactly step ``step``'s bytes (and their checksums agree)."""
    for g in ranks:
        d = g - plan.train_world
        dump = torch.load(run_dir / "weights" / f"rank-{g}.pt")
        assert dump["step"] == step, (g, dump["step"])
        for i, boxes in plan.dst_holdings(d).items():
            for box, have in zip(boxes, dump["tensors"][i]):
                want = synthetic_region(plan.model.tensors[i], box, step)
                assert torch.equal(checksum(u8(have.contiguous())), checksum(u8(want.contiguous())))
                assert torch.equal(u8(have.contiguous()), u8(want.contiguous()))


def u8_shaped(t):
    """The bytes of ``t`` (a 0-d tensor as one element), keeping its shape."""
    return (t.reshape(1) if t.dim() == 0 else t).view(torch.uint8)


def assert_inference_weights(run_dir: Path, plan, step: int) -> None:
    """Every inference rank holds exactly its planned boxes of step ``step``'s bytes."""
    for d in range(plan.infer_world):
        dump = torch.load(run_dir / "weights" / f"rank-{plan.train_world + d}.pt")
        assert dump["step"] == step
        want_holdings = plan.dst_holdings(d)
        assert dump["holdings"] == dict(want_holdings)
        for i, boxes in want_holdings.items():
            for box, have in zip(boxes, dump["tensors"][i]):
                want = synthetic_region(plan.model.tensors[i], box, step)
                assert torch.equal(u8_shaped(have), u8_shaped(want)), (d, plan.model.tensors[i].name, box, step)
