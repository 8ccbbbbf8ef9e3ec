"""The control plane's all-reduce: a binomial tree of point-to-point messages (``2 ceil(log2 n)``
steps, each waited by the caller's bounded wait), where gloo's own all-reduce is a ring of
``2 (n - 1)``; the commit protocol follows how far each rank got in it (commit.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError


TAG_CONTROL = (1 << 30) - 2  # the control plane's tree all-reduce (the checksum exchange has 2**30 - 1)


class SubtreeLost(TransferError):
    """The tree all-reduce's result is complete on this rank, but forwarding it to a child failed (a dead
    or silent child): that child's part of the tree did not get it from here."""


def tree_all_reduce(v: torch.Tensor, combine, *, rank: int, world: int, group, wait, progress=None) -> None:
    """``v`` (a CPU tensor) combined elementwise over ranks ``0 .. world - 1`` of ``group``, in place:
    up a binomial tree to rank 0 (at level ``k`` rank ``r + k`` sends to ``r`` where ``r % 2k == 0``),
    then down it, ``2 ceil(log2 world)`` steps of one message each, every one waited by
    ``wait(works)`` (the runtime: ``wait_all`` inside one ``run_bounded``, so the whole tree is bounded
    and costs one helper thread). gloo's own all-reduce is a ring of ``2 (world - 1)``
    sequential steps, which for these few bytes costs a latency per step: 14 steps took 7-12 ms on 8
    ranks sharing 2 cores here, and would be ~1,000 at 512 ranks. ``combine(a, b)`` returns the
    elementwise result (associative and commutative: MIN, SUM).

    ``progress`` (optional; the commit protocol's, commit.py) is told how far this rank got, and may
    stop it: ``progress.begin_send()`` just before this rank's contribution goes up (False: stop, nothing
    sent), ``progress.result()`` once ``v`` holds the final result here, before it is forwarded down
    (False, the root only: stop, nothing forwarded). A child that cannot be sent the result does not
    undo it: the other children still get it, then ``SubtreeLost`` is raised (``v`` holds the result)."""
    levels = []
    k = 1
    while k < world:
        levels.append(k)
        k *= 2
    tmp = torch.empty_like(v)
    for k in levels:  # up: gather into rank 0
        if rank % (2 * k) == k:
            if progress is not None and not progress.begin_send():
                raise TransferError("stopped before this rank's contribution was sent")
            wait([dist.isend(v, rank - k, group=group, tag=TAG_CONTROL)])
            break
        if rank + k < world:
            wait([dist.irecv(tmp, rank + k, group=group, tag=TAG_CONTROL)])
            v.copy_(combine(v, tmp))
    if rank == 0 and progress is not None and not progress.result():
        raise TransferError("stopped before the result was forwarded")
    lost: list[str] = []
    for k in reversed(levels):  # down: rank 0's result to every rank
        if rank % (2 * k) == 0:
            if rank + k < world:
                try:
                    wait([dist.isend(v, rank + k, group=group, tag=TAG_CONTROL)])
                except (RuntimeError, TransferError) as exc:
                    lost.append(f"rank {rank + k}: {exc}")
        elif rank % (2 * k) == k:
            wait([dist.irecv(v, rank - k, group=group, tag=TAG_CONTROL)])
            if progress is not None:
                progress.result()
    if lost:
        raise SubtreeLost(f"result complete here, not forwarded to {'; '.join(lost)}")
