"""Run every rank of a plan (or of a session of plans) as a process on this machine and collect reports.

``launch_local_ranks(plans, options, warmup=1)`` writes the session file every rank reads
(``runtime/session_file.py``, the Slurm launcher's format: the planner's plans, each rank derives its
own steps), private, in the run directory and without the run token (spawn's pipe stays small: a rank
that dies at start cannot block its launcher; the token travels through it), starts ``T + I`` processes once
(``torch.multiprocessing``: gloo ranks fork from a server that imported torch once, NCCL ranks are spawned;
``start_method``), rendezvous on 127.0.0.1 at a free port with
a fresh random run token, runs every plan in order in the same processes (``worker.run_rank_session``) and
returns ``{plan name: reports in rank order}``, or raises ``LocalRunError`` with every failure, root
cause first.

Bounded, fast failure: a rank that exits without a report is known at once; from the first failure on,
the survivors have ``timeout_s`` plus a grace to report (they stop within the timeout, refit.py); a
rank still silent once the others have gone quiet for ``QUIET_S`` (``runtime/bounds.py``) is killed (a hung rank). Processes are killed before they are joined; none is left
behind. Ranks never outlive the launcher: each watches its parent (``PR_SET_PDEATHSIG`` and a
polling thread) and exits within a second of its death; ``stop`` (an Event) ends a run early.
"""

from __future__ import annotations

import ctypes
import os
import queue as _queue
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Mapping

import torch
import torch.multiprocessing as mp
from multiprocessing import reduction

from reshardctl.errors import LaunchError, TransferError, VerificationError
from reshardctl.launch.failures import failure_text, lost_record, order_failures
from reshardctl.launch.ports import free_port
from reshardctl.runs.rundir import pid_alive
from reshardctl.runtime.bounds import GRACE_S, quiet_s
from reshardctl.runtime.contract import RankReport, RunOptions
from reshardctl.runtime.env import RankEnv, make_rank_env
from reshardctl.runtime.session_file import read_session, write_session
from reshardctl.runtime.worker import run_rank_session
from reshardctl.topology import side_of_global

RANKS_PAYLOAD_PREFIX = ".ranks-"  # the session file of a run's local ranks in its run directory, 0600


def choose_local_backend(world: int, device: str) -> str:
    """gloo for ``--device cpu`` (or ``RESHARDCTL_FORCE_CPU=1``); NCCL where every rank has its own GPU;
    gloo for ``cuda-gloo`` (every rank's weights on a CUDA device, one GPU may hold them all, the bytes
    through host memory: runtime/host_staging.py), which needs a CUDA device."""
    forced_cpu = os.environ.get("RESHARDCTL_FORCE_CPU", "") not in ("", "0", "false")
    if device == "cuda-gloo":
        if forced_cpu:
            raise LaunchError("device cuda-gloo but RESHARDCTL_FORCE_CPU is set")
        if not torch.cuda.is_available():
            raise LaunchError("device cuda-gloo: the ranks' weights go on a CUDA device, and this machine has none")
        return "gloo"
    if device == "cpu" or forced_cpu:
        if device == "cuda":
            raise LaunchError("--device cuda but RESHARDCTL_FORCE_CPU is set")
        return "gloo"
    ok = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if device == "cuda" and not ok:
        raise LaunchError(f"--device cuda: {world} ranks need {world} GPUs, this machine has "
                          f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    return "nccl" if ok else "gloo"


def watch_parent(launcher_pid: int, period_s: float = 0.5) -> None:
    """This process dies with the launcher: SIGKILL on its parent's death (Linux; the parent is the
    launcher under spawn, the fork server under forkserver, which exits when the launcher does), and a
    daemon thread that exits the process when its parent is gone (reparented) or the launcher is, in
    case the signal is not available."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = os.getppid()
    if parent == 1 or not pid_alive(launcher_pid):
        os._exit(1)

    def poll() -> None:
        while True:
            if os.getppid() != parent or not pid_alive(launcher_pid):
                os._exit(1)
            time.sleep(period_s)

    threading.Thread(target=poll, name="reshardctl-parent-watch", daemon=True).start()


class _Inherited:
    """What a rank started by the fork server takes from the launcher as it is at the start (the fork
    server's own is from when it started): the environment, and standard output and error (passed as
    descriptors, so output goes where the launcher's goes now)."""

    def __init__(self, environ: dict[str, str], fds: tuple[int, ...] = (1, 2)):
        self.environ, self.fds = environ, fds

    def __reduce__(self):
        return (_Inherited._rebuild, (self.environ, tuple(reduction.DupFd(fd) for fd in self.fds)))

    @staticmethod
    def _rebuild(environ, dups) -> "_Inherited":
        return _Inherited(environ, tuple(d.detach() for d in dups))

    def apply(self) -> None:
        for target, fd in zip((1, 2), self.fds):
            os.dup2(fd, target)
            os.close(fd)
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)


def _child(env: RankEnv, payload: str, token: str, names: list[str], warmup: int, threads: int, q,
           launcher: int, inherited: _Inherited | None = None) -> None:
    """One rank: its plans, options and fallback from the launcher's session file ``payload``, the run
    token from the launcher (through the start method's pipe: never in a file), then the session."""
    if inherited is not None:
        inherited.apply()
    watch_parent(launcher)
    torch.set_num_threads(threads)
    try:
        spec = read_session(payload)
        options = replace(spec.options, token=token)
        reports = run_rank_session(env, spec.plans, options, warmup=warmup, fallback=spec.fallback)
    except BaseException as exc:  # noqa: BLE001 - run_rank_session should not raise; report anyway
        reports = {n: RankReport(env.global_rank, env.side, env.side_rank, ok=False,
                                 error_type=type(exc).__name__, error_message=str(exc)) for n in names}
    q.put((env.global_rank, reports))
    q.close()
    q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    if env.global_rank == 0:  # it hosts the run's store: the others may still need it to learn a failure
        while True:  # until the launcher kills it, after the last report (or it dies with the launcher)
            time.sleep(1)
    os._exit(0)  # no teardown: after a failure, a dead peer's pending ops could hold it up


def _remove_payload(payload: str, scratch: str | None) -> None:
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        return
    try:
        os.unlink(payload)
    except FileNotFoundError:
        pass


class LocalRunError(TransferError):
    """A local run failed; ``reports`` holds what the ranks that finished returned; ``failures`` every
    failure record, root cause first (``lost`` ranks: no report)."""

    def __init__(self, message: str, reports: list[RankReport], *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.reports = reports
        self.session: dict[str, list[RankReport]] = {}
        self.failures: list[dict] = []
        self.interrupted = False
        self.stopped_after_s: float | None = None  # from the first failure the launcher knew to the last process killed


class LocalVerificationError(LocalRunError, VerificationError):
    """Every failure was a verification failure (bytes arrived, checksums disagreed)."""


def run_local(plan, options: RunOptions, *, deadline_s: float | None = None, host: str = "127.0.0.1",
              backend: str | None = None, fallback=None) -> list[RankReport]:
    """Spawn every rank on this machine; return their reports (rank order) or raise ``TransferError``."""
    return launch_local_ranks({"plan": plan}, options, warmup=0, deadline_s=deadline_s, host=host,
                             backend=backend, fallback=fallback)["plan"]


def _lost_record(rank: int, world_t: int, why: str, at: float, run_dir: str | None) -> dict:
    side, side_rank = side_of_global(rank, world_t)
    return lost_record(rank, side, side_rank, socket.gethostname(), at, why, run_dir)


def start_method(backend: str, *, cuda: bool = False) -> str:
    """How local ranks start: gloo ranks fork from a server that imported torch and the runtime once
    (``forkserver``: no rank pays the import, a few CPU seconds each); NCCL ranks, and gloo ranks with
    CUDA weights (``cuda``), are spawned fresh (nothing CUDA-related is ever inherited across a fork).
    ``RESHARDCTL_START_METHOD=spawn`` forces spawn (benchmarks/rank_start.py compares the two)."""
    forced = os.environ.get("RESHARDCTL_START_METHOD", "")
    if forced not in ("", "spawn", "forkserver"):
        raise LaunchError(f"RESHARDCTL_START_METHOD={forced!r}: expected spawn or forkserver")
    if forced:
        return forced
    return "forkserver" if backend == "gloo" and not cuda else "spawn"


def _context(method: str):
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["reshardctl.runtime.worker"])  # torch and the runtime, imported once
    return ctx


def check_main_importable() -> None:
    """Every rank (spawned, or forked from the fork server) re-runs the launching program's main module by
    its path: refuse at once (LaunchError) where that path does not exist (a program read from standard
    input), instead of ranks that die."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is not None and not os.path.exists(path):
        raise LaunchError(
            f"local ranks are started by multiprocessing (fork server or spawn), which re-imports the main "
            f"module from {path!r} in every rank, and there is no such file",
            hint="run from a script file (with an `if __name__ == \"__main__\":` guard), `python -c`, "
                 "or the reshardctl command, not from standard input",
        )


def launch_local_ranks(plans: Mapping[str, object], options: RunOptions, *, warmup: int = 1,
                      deadline_s: float | None = None, host: str = "127.0.0.1",
                      backend: str | None = None, fallback=None,
                      stop: threading.Event | None = None) -> dict[str, list[RankReport]]:
    """One spawn, one rendezvous, one process group for several plans of the same worlds, run in order
    (``warmup`` untimed + ``options.iterations`` timed refits each, then the raw baseline when asked).
    Returns ``{name: reports in rank order}`` or raises ``LocalRunError`` (its ``reports``: the first
    failing plan's, ``session``: all of them, ``failures``: root cause first)."""
    if not plans:
        raise LaunchError("launch_local_ranks needs at least one plan")
    names = list(plans)
    first = plans[names[0]]
    for n in names[1:]:
        q = plans[n]
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
    options = replace(options, token=options.token or secrets.token_hex(16))
    if deadline_s is None:  # a backstop only: failures end a run within timeout_s + GRACE_S of the first
        deadline_s = 120.0 + options.timeout_s * (2 * (options.iterations + warmup) * len(names) + 2) * (1 + options.retries)
    host_staged = options.device == "cuda-gloo"
    method = start_method(backend, cuda=host_staged)
    check_main_importable()
    ctx = _context(method)
    q = ctx.Queue()
    procs = []
    # the session goes to the ranks through a private file, not through spawn's pipe: a rank that dies before
    # reading a large pipe payload would block its start() for ever (the parent holds the pipe's read end).
    # The file is in the run directory (0600, deleted at the end), never holds the token, and only
    # without a run directory goes to a private temporary directory
    if options.run_dir:
        scratch = None
        payload = os.path.join(options.run_dir, f"{RANKS_PAYLOAD_PREFIX}{secrets.token_hex(4)}.pickle")
    else:
        scratch = tempfile.mkdtemp(prefix="reshardctl-ranks-")
        payload = os.path.join(scratch, "session.pickle")
    write_session(payload, plans, replace(options, token=None), warmup, fallback)
    # ranks log c10d errors through their reports, not as C++ warnings with stack traces on stderr
    saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = saved or "ERROR"
    try:
        inherited = _Inherited(dict(os.environ)) if method == "forkserver" else None
        for r in range(world):
            env = make_rank_env(r, first.train_world, first.infer_world, host, port, backend=backend,
                                host_staged=host_staged)
            p = ctx.Process(target=_child, args=(env, payload, options.token, names, warmup, threads, q,
                                                 os.getpid(), inherited),
                            name=f"reshardctl-rank-{r}")
            procs.append(p)
            p.start()
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.kill()
        _remove_payload(payload, scratch)
        raise
    finally:
        if saved is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    reports: dict[int, dict[str, RankReport]] = {}
    lost: dict[int, dict] = {}
    end = time.monotonic() + deadline_s
    first_failure: float | None = None
    interrupted = False

    last_change = time.monotonic()
    quiet = quiet_s(options.timeout_s, options.retries)  # survivors may first try to settle

    def failed_now() -> None:
        nonlocal first_failure, end
        if first_failure is None:
            first_failure = time.monotonic()
            end = min(end, first_failure + options.timeout_s * (1 + options.retries) + GRACE_S)

    def took_report(timeout: float) -> bool:
        """A rank's report taken from the queue within ``timeout`` s and kept (a failed one starts the end)."""
        nonlocal last_change
        try:
            rank, rep = q.get(timeout=timeout)
        except _queue.Empty:
            return False
        reports[rank] = rep
        last_change = time.monotonic()
        if not all(x.ok for x in rep.values()):
            failed_now()
        return True

    try:
        while len(reports) + len(lost) < world:
            if stop is not None and stop.is_set():
                interrupted = True
                break
            if took_report(0.1):
                continue
            for r, p in enumerate(procs):
                if r not in reports and r not in lost and p.exitcode is not None:
                    if took_report(0.5):  # it may have reported just before exiting
                        continue
                    code = p.exitcode
                    why = (f"killed by signal {-code}" if code < 0 else f"exited with code {code}") + " without a report"
                    lost[r] = _lost_record(r, first.train_world, why, time.time(), options.run_dir)
                    last_change = time.monotonic()
                    failed_now()
            if first_failure is not None and time.monotonic() > last_change + quiet:
                end = min(end, time.monotonic())  # the outcome is known and the others have gone quiet
            if time.monotonic() > end:
                for r in range(world):
                    if r not in reports and r not in lost:
                        why = (f"stopped by the launcher: still silent {quiet:g} s after the last report, "
                               f"{time.monotonic() - first_failure:.1f} s after the first failure (hung?)" if first_failure is not None
                               else f"stopped by the launcher: did not finish within {deadline_s:.0f} s")
                        lost[r] = _lost_record(r, first.train_world, why, time.time(), options.run_dir)
                break
    finally:
        for p in procs:  # kill before join: nothing outlives the run
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        q.close()
        _remove_payload(payload, scratch)
    stopped_after = None if first_failure is None else time.monotonic() - first_failure
    session = {n: [reports[r][n] for r in sorted(reports)] for n in names}
    if interrupted:
        err = LocalRunError(f"local run interrupted: {len(reports)} of {world} ranks had reported; the others "
                            f"were stopped", session.get(names[0], []))
        err.session, err.interrupted = session, True
        err.failures = order_failures([], session.get(names[0], []))
        raise err
    for n in names:
        ordered = session[n]
        failed = [r for r in ordered if not r.ok]
        if failed or lost:
            failures = order_failures(list(lost.values()), ordered)
            where = f" (plan {n!r})" if len(names) > 1 else ""
            msg = failure_text(failures, f"local run failed{where}")
            only_verify = not lost and all(r.error_type == "VerificationError" for r in failed)
            err = (LocalVerificationError if only_verify else LocalRunError)(msg, ordered)
            err.session, err.failures = session, failures
            err.stopped_after_s = stopped_after
            raise err
    return session
