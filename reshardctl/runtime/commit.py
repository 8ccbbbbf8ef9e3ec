"""Verify, vote, commit: inference ranks switch to the new weights only when EVERY rank verified.

1. Each rank reaches a local verdict: ``OK`` (no error, every received checksum matched, every
   destination box written exactly once, the optional whole-model check passed), ``BAD_DATA`` or
   ``FAILED`` (the transfer raised).
2. One all-reduce (MIN) over all ranks of a vector holding each rank's verdict in its own slot: every
   rank learns every rank's verdict.
3. All OK: inference ranks swap staged <-> current (a pointer swap; the old weights become the next
   refit's staging). Otherwise nothing changes and every rank raises ``VerificationError`` (bad data
   somewhere) or ``TransferError`` (a rank failed); a vote that cannot complete (a dead peer) raises
   ``TransferError`` within the group timeout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError, VerificationError
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.pack import LocalWeights, byte_view
from reshardctl.runtime.weights import WeightSource

FAILED, BAD_DATA, OK = 0, 1, 2
_WORDS = {FAILED: "failed", BAD_DATA: "failed verification", OK: "ok"}


def full_check(staged: LocalWeights, source: WeightSource, step: int, limit: int = 20) -> list[str]:
    """Every destination box equals the weight source's values for ``step`` (bytes)."""
    problems = []
    for i, boxes in staged.boxes.items():
        for box, have in zip(boxes, staged.data[i]):
            want = source.region(i, box, step, have.device)
            if not torch.equal(byte_view(have), byte_view(want)):
                problems.append(f"{staged.model.tensors[i].name} {box}: differs from the step-{step} weights")
                if len(problems) >= limit:
                    return problems
    return problems


def vote(groups: Groups, code: int) -> list[int]:
    """Every rank's verdict, gathered by one MIN all-reduce (bounded by the group timeout)."""
    env = groups.env
    v = torch.full((env.world_size,), OK, dtype=torch.int64, device=groups.device)
    v[env.global_rank] = code
    try:
        dist.all_reduce(v, op=dist.ReduceOp.MIN)
    except RuntimeError as exc:
        raise TransferError(f"rank {env.global_rank}: the commit vote failed (a rank is gone?): {exc}") from exc
    return [int(x) for x in v.cpu().tolist()]


def decide(codes: list[int], groups: Groups, train_world: int, step: int, mine: list[str],
           local_error: BaseException | None) -> None:
    """Raise unless every rank voted OK."""
    bad = [(r, c) for r, c in enumerate(codes) if c != OK]
    if not bad:
        return
    who = ", ".join(
        f"rank {r} ({'train' if r < train_world else 'infer'} {r if r < train_world else r - train_world}) {_WORDS[c]}"
        for r, c in bad[:8]
    )
    msg = f"refit of step {step} not committed; inference ranks keep their previous weights: {who}"
    if local_error is not None:
        msg += f"; here: {local_error}"
    elif mine:
        msg += "; here: " + "; ".join(mine[:5])
    cls = TransferError if any(c == FAILED for _, c in bad) else VerificationError
    raise cls(msg)
