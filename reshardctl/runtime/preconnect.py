"""First contact: every point-to-point direction and broadcast group a rank's program uses, connected
once right after the groups are built, under the run's deadline (NCCL connects lazily inside the post,
outside every bound)."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.plan.schedule import BroadcastBucket, P2PRound
from reshardctl.runtime.abort import abort_after_failure, on_nccl
from reshardctl.runtime.bounded_wait import Abandoned, start_helper
from reshardctl.runtime.groups import Groups, broadcast_groups


TAG_CONNECT = (1 << 30) - 3  # pre-connect's messages (the control plane has 2**30 - 2)


def program_peers(plan, rank: int) -> tuple[list[int], list[int]]:
    """The peers this rank sends to and receives from in a plan, or a list of plans (rounds, relays and
    the gathers of broadcast buckets), each sorted: the directions its program uses, no others (NCCL
    gives every connected direction its own buffers)."""
    sends: set[int] = set()
    recvs: set[int] = set()
    for pl in plan if isinstance(plan, (list, tuple)) else [plan]:
        for s in pl.steps_for(rank):
            if isinstance(s, P2PRound):
                sends.update(pr.peer for pr in s.sends)
                recvs.update(pr.peer for pr in s.recvs)
            elif isinstance(s, BroadcastBucket):
                for g in s.gather:
                    if g.peer == rank and rank != s.root:
                        sends.add(s.root)
                    elif rank == s.root and g.peer != rank:
                        recvs.add(g.peer)
    sends.discard(rank)
    recvs.discard(rank)
    return sorted(sends), sorted(recvs)


def _finish(works, stop: threading.Event, cuda: bool) -> None:
    """Wait for ``works`` in the pre-connect's helper thread: gloo's blocking ``wait`` (bounded by the
    group timeout), NCCL's completion polled until done or until the waiting thread gave up (``stop``)."""
    if cuda:
        while not all(w.is_completed() for w in works):
            if stop.is_set():
                return
            time.sleep(1e-3)
    for w in works:
        w.wait()


def preconnect(groups: Groups, plan, timeout_s: float) -> dict:
    """Connect every path the refits will use, once, right after the groups are built, bounded like
    every other wait: one small exchange with every program peer of this rank (``program_peers``: one
    ``batch_isend_irecv`` on the data group, the directions the program uses), then one broadcast per
    broadcast group this rank is in, in the plan's order (``broadcast_groups``, the same on every rank),
    one group at a time. NCCL connects point-to-point channels lazily inside the post (``ncclGroupEnd``)
    and a sub-communicator's rings at its first collective: a peer that never posts would hold the
    posting thread there, outside every deadline. So the posts run in a helper thread and this thread
    waits with the run's deadline, stops at once when another rank published a failure (``Abandoned``),
    and on its own failure publishes it, aborts reshardctl's communicators (CUDA) and raises
    ``TransferError``. On gloo the same exchange runs (cheap), so the path is exercised everywhere.
    Returns what it connected (``peers``, ``groups``, ``seconds``)."""
    rank = groups.env.global_rank
    cuda = on_nccl(groups)
    wire = getattr(groups, "wire_device", groups.device)  # the host where gloo carries CUDA weights
    sends, recvs = program_peers(plan, rank)
    subgroups = [(m, groups.broadcast[m]) for m in broadcast_groups(plan) if m in groups.broadcast]
    stage = [f"the exchange with its {len(set(sends) | set(recvs))} program peer(s)"]
    stop = threading.Event()

    def job() -> None:
        if cuda:
            torch.cuda.set_device(groups.device)  # the device is per thread
        one = torch.ones(1, dtype=torch.uint8, device=wire)
        ins = [torch.zeros(1, dtype=torch.uint8, device=wire) for _ in recvs]
        ops = [dist.P2POp(dist.isend, one, p, group=groups.data, tag=TAG_CONNECT) for p in sends]
        ops += [dist.P2POp(dist.irecv, t, p, group=groups.data, tag=TAG_CONNECT) for p, t in zip(recvs, ins)]
        if ops:
            _finish(dist.batch_isend_irecv(ops), stop, cuda)
        for members, pg in subgroups:
            if stop.is_set():
                return
            stage[0] = f"the broadcast over group {list(members)}"
            b = torch.zeros(1, dtype=torch.uint8, device=wire)
            _finish([dist.broadcast(b, src=members[0], group=pg, async_op=True)], stop, cuda)

    t0 = time.monotonic()
    done, err = start_helper(job)
    end = t0 + timeout_s + 1.0  # gloo's own timeout fires first
    next_check = t0 + 0.05
    failure: TransferError | None = None
    while not done.wait(0.05):
        now = time.monotonic()
        if groups.store is not None and now >= next_check:
            next_check = now + 0.1
            rec = groups.failure()
            if rec is not None:
                failure = Abandoned(f"pre-connect: stopped waiting: {rec}")
                break
        if now > end:
            failure = TransferError(
                f"rank {rank}: pre-connect not complete within {timeout_s:g} s, in {stage[0]}: a peer never "
                f"posted (dead, hung, or still building its groups)")
            break
    if failure is None and err:
        failure = TransferError(f"rank {rank}: pre-connect failed in {stage[0]}: {err[0]}")
    if failure is not None:
        stop.set()
        if not isinstance(failure, Abandoned):
            groups.publish_failure(f"rank {rank} failed in pre-connect: {failure}")
        abort_after_failure(groups)
        raise failure
    return {"peers": len(set(sends) | set(recvs)), "groups": len(subgroups), "seconds": time.monotonic() - t0}
