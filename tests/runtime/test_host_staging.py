"""runtime/host_staging.py on real gloo ranks, CPU tensors staged as CUDA ones would be (``stage_cpu``):
a received message reaches its destination only at ``wait()`` (the landing copy), exact; a staged send
reads the bytes at post time (a later change of the source does not travel); a broadcast through host
buffers reaches every member; a receive whose sender never posts ends within the group's timeout. The
CUDA side (pinned buffers, the event before gloo reads, non-blocking landings) runs in
tests/runtime/test_gpu.py and benchmarks/gpu_one_device.sh (step gloo_refit)."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from helpers.spawned_ranks import run_ranks


def _rank(rank: int, port: int, q) -> None:
    from reshardctl.runtime import host_staging

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=timedelta(seconds=1.5))
        groups = SimpleNamespace(timeout=timedelta(seconds=1.5), store=None)
        peer = 1 - rank
        mine = torch.arange(1000, dtype=torch.int32) * (rank + 3)
        src = mine.clone()
        dst = torch.full((1000,), -1, dtype=torch.int32)
        plain_out, plain_in = torch.tensor([rank + 10]), torch.tensor([0])
        ops = [dist.P2POp(dist.isend, src, peer), dist.P2POp(dist.irecv, dst, peer),
               dist.P2POp(dist.isend, plain_out, peer), dist.P2POp(dist.irecv, plain_in, peer)]
        works = host_staging.post_p2p(ops, groups, "test", stage_cpu=True)
        src.zero_()  # after the post: the staged copy was taken at post time
        time.sleep(0.3)  # the peer's bytes have arrived in the host buffer by now, not in dst
        before = bool((dst == -1).all())
        for w in works:
            w.wait()
        out = {"works": len(works), "untouched_before_wait": before,
               "exact": torch.equal(dst, torch.arange(1000, dtype=torch.int32) * (peer + 3)),
               "plain": int(plain_in.item()), "completed": all(w.is_completed() for w in works)}
        bucket = torch.arange(64, dtype=torch.uint8) if rank == 0 else torch.zeros(64, dtype=torch.uint8)
        host_staging.broadcast(bucket, 0, dist.group.WORLD, groups, rank, "bucket", stage_cpu=True).wait()
        out["broadcast_exact"] = torch.equal(bucket, torch.arange(64, dtype=torch.uint8))
        if rank == 1:  # rank 0 never sends this one: the wait must end within gloo's timeout, with an error
            lonely = host_staging.post_p2p([dist.P2POp(dist.irecv, torch.zeros(8), 0, tag=7)], groups, "lonely",
                                           stage_cpu=True)
            t0 = time.monotonic()
            try:
                lonely[0].wait()
                out["lonely"] = "completed"
            except RuntimeError as exc:
                out["lonely"] = type(exc).__name__
            out["lonely_s"] = time.monotonic() - t0
        else:
            time.sleep(2.5)  # alive while rank 1's receive times out (its peer exists, it just never sends)
        q.put((rank, out, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_staged_messages_land_at_wait_exact_and_a_missing_sender_is_bounded():
    res = run_ranks(_rank, 2, lambda r, port, q: (r, port, q), timeout_s=60)
    for rank, out in res.items():
        assert out["works"] == 1 and out["untouched_before_wait"] and out["exact"], (rank, out)
        assert out["plain"] == (1 - rank) + 10 and out["completed"] and out["broadcast_exact"], (rank, out)
    assert res[1]["lonely"] == "RuntimeError" and res[1]["lonely_s"] < 2.5, res[1]
