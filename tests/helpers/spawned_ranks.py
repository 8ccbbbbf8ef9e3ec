"""Spawned processes as an RL framework's ranks (the API tests): each puts (rank, result, error) on a
queue; every rank's result is collected and every error raised."""

from __future__ import annotations

import torch.multiprocessing as mp

from reshardctl.launch.local import free_port


def run_ranks(target, world: int, args, timeout_s: float = 300.0) -> dict:
    """``target(*args(rank, port, queue))`` in ``world`` spawned processes; {rank: result}. Asserts no
    rank reported an error."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=args(r, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = {r: (res, err) for r, res, err in (q.get(timeout=timeout_s) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
    for r, (res, err) in got.items():
        assert err is None, f"rank {r}: {err}"
    return {r: res for r, (res, _) in got.items()}
