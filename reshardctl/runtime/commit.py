"""Two-phase commit on the control plane: inference ranks switch to the new weights only when EVERY
rank verified AND every rank learned that decision.

1. **Prepare (vote)**: each rank's verdict, ``OK`` (no error, every received checksum matched, every
   destination box written exactly once, every local copy equal, the optional whole-model check
   passed), ``BAD_DATA`` or ``FAILED``, in its own slot of one MIN all-reduce on the gloo control group:
   every rank learns every verdict. Anything but all-OK: nothing changes, every rank raises
   ``VerificationError`` (bad data) or ``TransferError``.
2. **Learn (ack)**: all OK, a second all-reduce says "I know the decision" from every rank. Only a rank
   whose ack completed commits (swaps staged <-> current, a pointer swap; the previous weights stay in
   the staged copy until the next refit's bytes arrive). A rank whose ack failed cannot know whether the
   others commit: it keeps its previous weights and raises ``TransferError`` saying so.
3. **Agreement** (``agree``): at the common start of the next refit, and once at the end of a session,
   every rank's committed step is gathered; ranks ahead of the others (their ack completed where
   another's did not) roll back to the previous weights they still hold, so all inference ranks serve
   the same step; a disagreement that cannot be repaired is an error.

Every wait is bounded (``groups.run_bounded``): a dead, silent or failed rank ends the vote or the ack
within the timeout on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError, VerificationError
from reshardctl.runtime.groups import Abandoned, Groups, run_bounded, tree_all_reduce, wait_all
from reshardctl.runtime.local_weights import LocalWeights, byte_view
from reshardctl.runtime.weights import WeightSource
from reshardctl.topology import is_trainer, side_of_global

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


_COMBINE = {dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.SUM: torch.add}


def _all_reduce(groups: Groups, v: torch.Tensor, op, what: str) -> torch.Tensor:
    """One bounded all-reduce on the control group (CPU tensor): a binomial tree (``tree_all_reduce``)
    run in one helper thread while this one watches for another rank's failure (``run_bounded``)."""
    env = groups.env
    timeout_s = groups.timeout.total_seconds()
    try:
        run_bounded(lambda: tree_all_reduce(v, _COMBINE[op], rank=env.global_rank, world=env.world_size,
                                            group=groups.ctrl, wait=wait_all), groups, timeout_s, what)
    except Abandoned:
        raise
    except (RuntimeError, TransferError) as exc:
        raise TransferError(f"{what} failed: {exc}") from exc
    return v


def vote(groups: Groups, code: int) -> list[int]:
    """Phase 1: every rank's verdict, gathered by one MIN all-reduce."""
    env = groups.env
    v = torch.full((env.world_size,), OK, dtype=torch.int64)
    v[env.global_rank] = code
    _all_reduce(groups, v, dist.ReduceOp.MIN, f"rank {env.global_rank}: the commit vote")
    return [int(x) for x in v.tolist()]


def learn(groups: Groups, step: int) -> None:
    """Phase 2: every rank knows the decision (raises ``TransferError`` when that cannot be confirmed)."""
    env = groups.env
    v = torch.ones(1, dtype=torch.int64)
    try:
        _all_reduce(groups, v, dist.ReduceOp.SUM, f"rank {env.global_rank}: the commit acknowledgement")
    except TransferError as exc:
        raise TransferError(f"refit of step {step}: this rank cannot confirm that every rank learned the "
                            f"decision, so it keeps its previous weights: {exc}") from exc
    if int(v.item()) != env.world_size:
        raise TransferError(f"refit of step {step}: acknowledgement {int(v.item())} of {env.world_size}: "
                            f"previous weights kept")


def decide(codes: list[int], train_world: int, step: int, mine: list[str],
           local_error: BaseException | None) -> None:
    """Raise unless every rank voted OK."""
    bad = [(r, c) for r, c in enumerate(codes) if c != OK]
    if not bad:
        return
    who = ", ".join(
        f"rank {r} ({' '.join(map(str, side_of_global(r, train_world)))}) {_WORDS[c]}"
        for r, c in bad[:8]
    )
    msg = f"refit of step {step} not committed; inference ranks keep their previous weights: {who}"
    if local_error is not None:
        msg += f"; here: {local_error}"
    elif mine:
        msg += "; here: " + "; ".join(mine[:5])
    cls = TransferError if any(c == FAILED for _, c in bad) else VerificationError
    raise cls(msg)


def gather_steps(groups: Groups, extra: int, mine: int | None) -> tuple[list[int], list[int | None]]:
    """One SUM all-reduce of a [2, world] vector: per rank ``extra`` (a readiness flag) and its
    committed step (None = none yet). Returns both rows."""
    env = groups.env
    v = torch.zeros(2, env.world_size, dtype=torch.int64)
    v[0, env.global_rank] = extra
    v[1, env.global_rank] = 0 if mine is None else mine + 1
    _all_reduce(groups, v, dist.ReduceOp.SUM, f"rank {env.global_rank}: the common start")
    return [int(x) for x in v[0].tolist()], [None if x == 0 else int(x) - 1 for x in v[1].tolist()]


def agree(steps: list[int | None], train_world: int) -> tuple[int | None, list[int]]:
    """The inference ranks' common committed step (the lowest) and the ranks ahead of it."""
    infer = [(r, s) for r, s in enumerate(steps) if not is_trainer(r, train_world)]
    known = [s for _, s in infer if s is not None]
    if not known:
        return None, []
    low = None if len(known) < len(infer) else min(known)  # a rank with nothing committed is the lowest
    return low, [r for r, s in infer if s is not None and (low is None or s > low)]
