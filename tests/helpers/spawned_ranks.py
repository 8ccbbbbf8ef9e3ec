"""Started processes as an RL framework's ranks (the API tests): each puts (rank, result, error) on a
queue; every rank's result is collected and every error raised.

The ranks start as the local launcher starts its own (launch/local.py ``start_method``): gloo ranks fork
from a server that imported torch and the runtime once (no rank pays the ~4 CPU seconds of imports),
GPU ranks are spawned fresh; ``RESHARDCTL_START_METHOD=spawn`` spawns every rank. A forked rank gets the
caller's environment as it is at the call (not the fork server's, from when the server started)."""

from __future__ import annotations

import os

import torch.multiprocessing as mp

from reshardctl.launch.local import start_method
from reshardctl.launch.ports import free_port

FORCE_CPU = "RESHARDCTL_FORCE_CPU"  # set for every test not marked gpu (conftest.py)


def _in_environment(environ: dict, target, *args) -> None:
    os.environ.clear()
    os.environ.update(environ)
    target(*args)


def run_ranks(target, world: int, args, timeout_s: float = 300.0) -> dict:
    """``target(*args(rank, port, queue))`` in ``world`` started processes; {rank: result}. Asserts no
    rank reported an error."""
    method = start_method("gloo" if os.environ.get(FORCE_CPU, "") not in ("", "0", "false") else "nccl")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["reshardctl.runtime.worker"])  # as the launcher: one server per process
    q = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_in_environment, args=(environ, target, *args(r, port, q))) for r in range(world)]
    for p in procs:
        p.start()
    got = {r: (res, err) for r, res, err in (q.get(timeout=timeout_s) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
    for r, (res, err) in got.items():
        assert err is None, f"rank {r}: {err}"
    return {r: res for r, (res, _) in got.items()}
