"""The reference the refit is measured against: raw send/recv of the same bytes, nothing else.

Every (sender, receiver) pair of the plan exchanges ONE preallocated, pre-touched buffer holding all
the bytes the plan's messages carry between them (no packing, no checksums, no unpacking), posted at
once after a common start. Gives this machine's ceiling for the plan's traffic pattern.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist

from reshardctl.plan.schedule import BroadcastBucket, P2PRound
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.pack import message_layout

_TAG = 1 << 30


def pair_bytes(plan, rank: int) -> tuple[dict[int, int], dict[int, int]]:
    out: dict[int, int] = defaultdict(int)
    inc: dict[int, int] = defaultdict(int)
    for s in plan.steps_for(rank):
        if isinstance(s, P2PRound):
            for pr in s.sends:
                out[pr.peer] += message_layout(plan.model, pr.regions).size
            for pr in s.recvs:
                inc[pr.peer] += message_layout(plan.model, pr.regions).size
        elif isinstance(s, BroadcastBucket):
            for g in s.gather:
                if g.peer == rank and rank != s.root:
                    out[s.root] += message_layout(plan.model, g.regions).size
                elif rank == s.root and g.peer != rank:
                    inc[g.peer] += message_layout(plan.model, g.regions).size
    return dict(out), dict(inc)


def raw_transfer(plan, groups: Groups, repeats: int = 3) -> dict[str, float]:
    rank = groups.env.global_rank
    out, inc = pair_bytes(plan, rank)
    bufs_out = {p: torch.ones(n, dtype=torch.uint8, device=groups.device) for p, n in sorted(out.items())}
    bufs_in = {p: torch.zeros(n, dtype=torch.uint8, device=groups.device) for p, n in sorted(inc.items())}
    best = float("inf")
    probe = torch.ones(1, device=groups.device)
    for _ in range(repeats):
        dist.all_reduce(probe)
        t0 = time.perf_counter()
        ops = [dist.P2POp(dist.isend, b, p, tag=_TAG) for p, b in bufs_out.items()]
        ops += [dist.P2POp(dist.irecv, b, p, tag=_TAG) for p, b in bufs_in.items()]
        for w in dist.batch_isend_irecv(ops) if ops else []:
            w.wait()
        if groups.device.type == "cuda":
            torch.cuda.synchronize(groups.device)
        best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "bytes_sent": float(sum(out.values())), "bytes_received": float(sum(inc.values()))}
