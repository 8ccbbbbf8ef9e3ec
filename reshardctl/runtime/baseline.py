"""The reference the refit is measured against: raw transfers of the same bytes, nothing else.

Point-to-point: every (sender, receiver) pair of the plan exchanges ONE preallocated, pre-touched uint8
buffer holding exactly the payload bytes the plan moves between them (summed over rounds, and over the
gather pieces of broadcast buckets), all posted in one ``batch_isend_irecv`` after a common start (no
packing, no checksums, no unpacking). Broadcast buckets: then the raw broadcast of every bucket's size
from its root over its group, pipelined two deep on one communicator and never across two (docs/gpu.md,
"NCCL communicator order": before a broadcast on another group, everything in flight is waited for).
Every wait is bounded (``bounded_wait.wait_works``). Best of ``repeats``; gives this machine's ceiling for the
plan's traffic pattern.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist

from reshardctl.plan.schedule import BroadcastBucket, P2PRound
from reshardctl.runtime.bounded_wait import wait_works
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.bucket_format import bucket_layout

_TAG = 1 << 30


def pair_bytes(plan, rank: int) -> tuple[dict[int, int], dict[int, int]]:
    """Payload bytes this rank sends to / receives from every peer (rounds and bucket gathers)."""
    out: dict[int, int] = defaultdict(int)
    inc: dict[int, int] = defaultdict(int)
    for s in plan.steps_for(rank):
        if isinstance(s, P2PRound):
            for pr in s.sends:
                out[pr.peer] += pr.nbytes
            for pr in s.recvs:
                inc[pr.peer] += pr.nbytes
        elif isinstance(s, BroadcastBucket):
            for g in s.gather:
                if g.peer == rank and rank != s.root:
                    out[s.root] += g.nbytes
                elif rank == s.root and g.peer != rank:
                    inc[g.peer] += g.nbytes
    return {p: n for p, n in out.items() if n}, {p: n for p, n in inc.items() if n}


def bucket_broadcasts(plan, rank: int) -> list[tuple[int, tuple[int, ...], int]]:
    """(root, group, bytes on the wire) of every bucket this rank takes part in, in step order."""
    return [(s.root, s.group, bucket_layout(plan.model, s.tensors).size)
            for s in plan.steps_for(rank) if isinstance(s, BroadcastBucket) and rank in s.group]


def raw_transfer(plan, groups: Groups, repeats: int = 3) -> dict[str, float]:
    rank = groups.env.global_rank
    dev = getattr(groups, "wire_device", groups.device)  # the host where gloo carries CUDA weights
    out, inc = pair_bytes(plan, rank)
    bcasts = bucket_broadcasts(plan, rank)
    bufs_out = {p: torch.ones(n, dtype=torch.uint8, device=dev) for p, n in sorted(out.items())}
    bufs_in = {p: torch.zeros(n, dtype=torch.uint8, device=dev) for p, n in sorted(inc.items())}
    biggest = max((n for _, _, n in bcasts), default=0)
    bbufs = [torch.zeros(biggest, dtype=torch.uint8, device=dev) for _ in range(2 if bcasts else 0)]
    best = (float("inf"), 0.0, 0.0)
    probe = torch.ones(1, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    limit = groups.timeout.total_seconds()
    for _ in range(repeats):
        wait_works([dist.all_reduce(probe, async_op=True)], groups, limit, "baseline start")
        sync()
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, b, p, tag=_TAG) for p, b in bufs_out.items()]
        ops += [dist.P2POp(dist.irecv, b, p, tag=_TAG) for p, b in bufs_in.items()]
        wait_works(dist.batch_isend_irecv(ops) if ops else [], groups, limit, "baseline point-to-point")
        sync()
        t1 = time.perf_counter()
        inflight: list = []  # (group, work): every one on the same communicator
        for k, (root, members, n) in enumerate(bcasts):
            pg = groups.group_for(members)
            if inflight and inflight[-1][0] is not pg:  # another communicator: drain this one first
                wait_works([w for _, w in inflight], groups, limit, "baseline broadcast")
                inflight = []
            if len(inflight) == 2:  # two deep: the buffer of bucket k - 2 is free once its broadcast is
                wait_works([inflight.pop(0)[1]], groups, limit, "baseline broadcast")
            inflight.append((pg, dist.broadcast(bbufs[k % 2][:n], src=root, group=pg, async_op=True)))
        wait_works([w for _, w in inflight], groups, limit, "baseline broadcast")
        sync()
        t2 = time.perf_counter()
        if t2 - t0 < best[0]:
            best = (t2 - t0, t1 - t0, t2 - t1)
    return {
        "seconds": best[0], "p2p_s": best[1], "broadcast_s": best[2],
        "bytes_sent": float(sum(out.values())), "bytes_received": float(sum(inc.values())),
        "broadcast_bytes": float(sum(n for _, _, n in bcasts)), "peers": float(len(set(out) | set(inc))),
    }
