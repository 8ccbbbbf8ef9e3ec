"""Run every rank of a plan as a process on this machine and collect their reports.

``run_local(plan, options)`` snapshots the plan (``StaticPlan.freeze``), spawns ``T + I`` processes
(``torch.multiprocessing``, spawn), rendezvous on 127.0.0.1 at a free port, waits for every
``RankReport`` with a deadline (a rank that dies or hangs is noticed, the survivors are stopped),
and returns the reports in rank order, or raises ``TransferError`` naming the failing ranks.
"""

from __future__ import annotations

import os
import queue as _queue
import socket
import time

import torch
import torch.multiprocessing as mp

from reshardctl.errors import LaunchError, TransferError, VerificationError
from reshardctl.runtime.contract import RankReport, RunOptions, StaticPlan
from reshardctl.runtime.env import RankEnv, make_rank_env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


def choose_local_backend(world: int, device: str) -> str:
    if device == "cpu":
        return "gloo"
    ok = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if device == "cuda" and not ok:
        raise LaunchError(f"--device cuda: {world} ranks need {world} GPUs, this machine has "
                          f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return "nccl" if ok else "gloo"


def _child(env: RankEnv, plan, options: RunOptions, threads: int, q) -> None:
    torch.set_num_threads(threads)
    from reshardctl.runtime.worker import run_rank

    try:
        report = run_rank(env, plan, options)
    except BaseException as exc:  # noqa: BLE001 - run_rank should not raise; report anyway
        report = RankReport(env.global_rank, env.side, env.side_rank, ok=False,
                            error_type=type(exc).__name__, error_message=str(exc))
    q.put(report)


class LocalRunError(TransferError):
    """A local run failed; ``reports`` holds what the ranks that finished returned."""

    def __init__(self, message: str, reports: list[RankReport], *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reports = reports


class LocalVerificationError(LocalRunError, VerificationError):
    """Every failure was a verification failure (bytes arrived, checksums disagreed)."""


def run_local(plan, options: RunOptions, *, deadline_s: float | None = None, host: str = "127.0.0.1",
              backend: str | None = None) -> list[RankReport]:
    """Spawn every rank on this machine; return their reports (rank order) or raise ``TransferError``."""
    static = StaticPlan.freeze(plan)
    world = static.train_world + static.infer_world
    backend = backend or choose_local_backend(world, options.device)
    threads = max(1, (os.cpu_count() or 1) // world)
    port = free_port(host)
    if deadline_s is None:
        deadline_s = 120.0 + options.timeout_s * (2 * options.iterations + 2)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    for r in range(world):
        env = make_rank_env(r, static.train_world, static.infer_world, host, port, backend=backend)
        p = ctx.Process(target=_child, args=(env, static, options, threads, q), name=f"reshardctl-rank-{r}")
        p.start()
        procs.append(p)
    reports: dict[int, RankReport] = {}
    lost: dict[int, str] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(reports) + len(lost) < world:
            try:
                rep = q.get(timeout=0.2)
                reports[rep.global_rank] = rep
                continue
            except _queue.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in reports and r not in lost and p.exitcode is not None:
                    # it may have reported just before exiting: give the queue a moment
                    try:
                        rep = q.get(timeout=1.0)
                        reports[rep.global_rank] = rep
                    except _queue.Empty:
                        lost[r] = f"exited with code {p.exitcode} without a report"
            if time.monotonic() > end:
                for r, p in enumerate(procs):
                    if r not in reports and r not in lost:
                        lost[r] = f"did not finish within {deadline_s:.0f} s"
                break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        q.close()
    ordered = [reports[r] for r in sorted(reports)]
    failed = [r for r in ordered if not r.ok]
    if failed or lost:
        lines = [f"rank {r}: {why}" for r, why in sorted(lost.items())]
        lines += [f"rank {r.global_rank} ({r.side} {r.side_rank}): {r.error_type}: {r.error_message}" for r in failed]
        only_verify = not lost and all(r.error_type == "VerificationError" for r in failed)
        msg = f"local run failed on {len(lost) + len(failed)} of {world} ranks:\n  " + "\n  ".join(lines)
        raise (LocalVerificationError if only_verify else LocalRunError)(msg, ordered)
    return ordered
