"""Run every rank of a plan (or of a session of plans) as a process on this machine and collect reports.

``run_local_session(plans, options, warmup=1)`` snapshots the plans (``StaticPlan.freeze``), spawns
``T + I`` processes once (``torch.multiprocessing``, spawn), rendezvous on 127.0.0.1 at a free port,
runs every plan in order in the same processes and process group (``worker.run_session``), waits for
every rank's reports with a deadline (a rank that dies or hangs is noticed, the survivors are stopped),
and returns ``{plan name: reports in rank order}``, or raises ``TransferError`` naming the failing ranks.
``run_local(plan, options)`` is the one-plan, no-warmup case.
"""

from __future__ import annotations

import os
import queue as _queue
import socket
import time
from typing import Mapping

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


def _child(env: RankEnv, plans, options: RunOptions, warmup: int, threads: int, q) -> None:
    torch.set_num_threads(threads)
    from reshardctl.runtime.worker import run_session

    try:
        reports = run_session(env, plans, options, warmup=warmup)
    except BaseException as exc:  # noqa: BLE001 - run_session should not raise; report anyway
        reports = {n: RankReport(env.global_rank, env.side, env.side_rank, ok=False,
                                 error_type=type(exc).__name__, error_message=str(exc)) for n in plans}
    q.put((env.global_rank, reports))


class LocalRunError(TransferError):
    """A local run failed; ``reports`` holds what the ranks that finished returned."""

    def __init__(self, message: str, reports: list[RankReport], *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reports = reports
        self.session: dict[str, list[RankReport]] = {}


class LocalVerificationError(LocalRunError, VerificationError):
    """Every failure was a verification failure (bytes arrived, checksums disagreed)."""


def run_local(plan, options: RunOptions, *, deadline_s: float | None = None, host: str = "127.0.0.1",
              backend: str | None = None) -> list[RankReport]:
    """Spawn every rank on this machine; return their reports (rank order) or raise ``TransferError``."""
    return run_local_session({"plan": plan}, options, warmup=0, deadline_s=deadline_s, host=host,
                             backend=backend)["plan"]


def run_local_session(plans: Mapping[str, object], options: RunOptions, *, warmup: int = 1,
                      deadline_s: float | None = None, host: str = "127.0.0.1",
                      backend: str | None = None) -> dict[str, list[RankReport]]:
    """One spawn, one rendezvous, one process group for several plans of the same worlds, run in order
    (``warmup`` untimed + ``options.iterations`` timed refits each, then the raw baseline when asked).
    Returns ``{name: reports in rank order}`` or raises ``LocalRunError`` (its ``reports``: the first
    failing plan's, ``session``: all of them)."""
    if not plans:
        raise LaunchError("run_local_session needs at least one plan")
    statics = {n: StaticPlan.freeze(p) for n, p in plans.items()}
    names = list(statics)
    first = statics[names[0]]
    for n in names[1:]:
        q = statics[n]
        if (q.train_world, q.infer_world) != (first.train_world, first.infer_world):
            raise LaunchError(
                f"plan {n!r} runs {q.train_world} trainer -> {q.infer_world} inference ranks but plan "
                f"{names[0]!r} runs {first.train_world} -> {first.infer_world}: one session has one set of processes",
                hint="run plans of other world sizes in a session of their own",
            )
    world = first.train_world + first.infer_world
    backend = backend or choose_local_backend(world, options.device)
    threads = max(1, (os.cpu_count() or 1) // world)
    port = free_port(host)
    if deadline_s is None:
        deadline_s = 120.0 + options.timeout_s * (2 * (options.iterations + warmup) * len(names) + 2)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    for r in range(world):
        env = make_rank_env(r, first.train_world, first.infer_world, host, port, backend=backend)
        p = ctx.Process(target=_child, args=(env, statics, options, warmup, threads, q), name=f"reshardctl-rank-{r}")
        p.start()
        procs.append(p)
    reports: dict[int, dict[str, RankReport]] = {}
    lost: dict[int, str] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(reports) + len(lost) < world:
            try:
                rank, rep = q.get(timeout=0.2)
                reports[rank] = rep
                continue
            except _queue.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in reports and r not in lost and p.exitcode is not None:
                    # it may have reported just before exiting: give the queue a moment
                    try:
                        rank, rep = q.get(timeout=1.0)
                        reports[rank] = rep
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
    session = {n: [reports[r][n] for r in sorted(reports)] for n in names}
    for n in names:
        ordered = session[n]
        failed = [r for r in ordered if not r.ok]
        if failed or lost:
            lines = [f"rank {r}: {why}" for r, why in sorted(lost.items())]
            lines += [f"rank {r.global_rank} ({r.side} {r.side_rank}): {r.error_type}: {r.error_message}" for r in failed]
            only_verify = not lost and all(r.error_type == "VerificationError" for r in failed)
            where = f" (plan {n!r})" if len(names) > 1 else ""
            msg = f"local run failed{where} on {len(lost) + len(failed)} of {world} ranks:\n  " + "\n  ".join(lines)
            err = (LocalVerificationError if only_verify else LocalRunError)(msg, ordered)
            err.session = session
            raise err
    return session
