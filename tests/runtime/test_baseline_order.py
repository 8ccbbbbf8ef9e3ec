"""The raw-transfer baseline (runtime/baseline.py) obeys one communicator at a time (docs/gpu.md, "NCCL
communicator order"): over a plan whose buckets alternate between two broadcast groups, no broadcast is
ever posted while one on another group is still in flight. Real gloo processes; ``dist.broadcast`` is
wrapped in each process to record every op's group from its post until the runtime's wait returns."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from reshardctl.plan.schedule import BroadcastBucket
from reshardctl.runtime.env import RankEnv

from helpers.spawned_ranks import run_ranks
from helpers.runtime_plans import alternating_plan


class _Tracked:
    """A posted broadcast until the runtime's ``wait`` on it returned."""

    def __init__(self, work, pg, inflight, lock):
        self.work, self.pg, self.inflight, self.lock = work, pg, inflight, lock

    def wait(self, *a, **kw):
        out = self.work.wait(*a, **kw)
        with self.lock:
            self.inflight.remove(self)
        return out

    def is_completed(self):
        return self.work.is_completed()


def _rank(rank: int, port: int, q) -> None:
    try:
        torch.set_num_threads(1)
        from reshardctl.runtime.baseline import raw_transfer
        from reshardctl.runtime.groups import init_groups, rendezvous, shutdown

        plan = alternating_plan()
        env = RankEnv(rank, 4, rank, "train" if rank < 2 else "infer", rank % 2, "127.0.0.1", port, "gloo")
        store = rendezvous(env, 30.0, token="baseline-order")
        groups = init_groups(env, plan, store, 30.0)
        inflight: list = []
        lock = threading.Lock()
        posts, mixed = [], []
        real = dist.broadcast

        def broadcast(tensor, src, group=None, async_op=False):
            with lock:
                if any(t.pg is not group for t in inflight):
                    mixed.append((src, [t.pg is group for t in inflight]))
                posts.append(src)
            work = real(tensor, src=src, group=group, async_op=async_op)
            if not async_op:
                return work
            t = _Tracked(work, group, inflight, lock)
            with lock:
                inflight.append(t)
            return t
        dist.broadcast = broadcast
        out = raw_transfer(plan, groups, repeats=2)
        dist.broadcast = real
        shutdown()
        q.put((rank, (posts, mixed, out["broadcast_bytes"], len(inflight)), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_the_baseline_never_has_broadcasts_in_flight_on_two_communicators():
    plan = alternating_plan()
    assert len({s.group for s in plan.steps_for(2) if isinstance(s, BroadcastBucket)}) == 2
    res = run_ranks(_rank, 4, lambda r, port, q: (r, port, q), timeout_s=240)
    for rank in (0, 2, 3):  # rank 0 roots buckets 0 and 2; inference ranks are in both groups
        posts, mixed, nbytes, left = res[rank]
        assert mixed == [], (rank, mixed)
        assert left == 0 and nbytes > 0
    assert res[2][0] == [0, 1, 0, 1] * 2  # every bucket, alternating groups, in both repeats
