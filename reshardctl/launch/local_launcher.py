"""The local launcher: every rank a process on this machine (``launch/local.py`` starts them), watched
from a thread while the main thread reports progress and turns SIGTERM/SIGINT/SIGHUP into a stop."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Mapping

from reshardctl.errors import InputError, Interrupted, LaunchError, ReshardError, TransferError
from reshardctl.launch.launcher import DryRun, LaunchJob, Outcome, Progress
from reshardctl.launch.local import RANKS_PAYLOAD_PREFIX, LocalRunError, choose_local_backend, launch_local_ranks
from reshardctl.runs.records import count_commits, events_dir, ranks_with_phase
from reshardctl.plan.refit_plan import Plan
from reshardctl.request.resolve import Inputs
from reshardctl.launch.memory_check import check_memory
from reshardctl.runs.rundir import launcher_alive, read_run, settle

MAX_LOCAL_RANKS = 32  # processes the local launcher will start on one machine


class _Signals:
    """SIGTERM/SIGINT/SIGHUP set ``stop`` (the launcher then kills the ranks and the session writes an
    interrupted summary; ``signame``: the first one's name); restored on exit. Only in the main thread
    (signals cannot be set elsewhere)."""

    def __init__(self, stop: threading.Event):
        self.stop, self.old = stop, {}
        self.signame: str | None = None

    def _stop(self, signum, _frame) -> None:
        if self.signame is None:
            self.signame = signal.Signals(signum).name
        self.stop.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.old[sig] = signal.signal(sig, self._stop)
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)


class LocalLauncher:
    name = "local"
    starting_state = "running"

    def check_detach(self) -> None:
        raise InputError("--detach needs the Slurm launcher (--launcher slurm, or launcher: slurm in the profile)")

    def check(self, topology) -> None:
        world = topology.world
        if world > MAX_LOCAL_RANKS:
            raise InputError(
                f"the local launcher runs every rank as a process on this machine: trainer {topology.train_world} + "
                f"inference {topology.infer_world} = {world} ranks is more than {MAX_LOCAL_RANKS}; "
                f"choose smaller layouts, run it on Slurm (--launcher slurm), or plan it with `reshardctl plan`"
            )

    def memory_estimate(self, inp: Inputs, plans: Mapping[str, Plan]) -> int | None:
        """The ranks run here: they must fit in this machine's memory (``InputError`` otherwise)."""
        return check_memory(dict(plans), gpus=choose_local_backend(inp.topology.world, "auto") == "nccl",
                            nccl=inp.site.nccl)["total"]

    def dry_run(self, inp, transports, *, out, mode, baseline, timeout_s, retries) -> DryRun:
        raise InputError("--dry-run is a Slurm launcher option, but the launcher is 'local' "
                         "(add --launcher slurm, or set launcher: slurm in the site profile)")

    def files(self, inp, plans, run_dir, *, iterations, warmup, mode) -> dict[str, str | bytes]:
        raise InputError("the local launcher starts its ranks itself: it has no files to start them by hand")

    def prepare(self, job: LaunchJob) -> None:
        return None  # launch_local_ranks writes the ranks' session file (without the token) as it starts them

    def run(self, job: LaunchJob, *, progress: Progress | None, stop, on_state) -> Outcome:
        plans, run_dir = job.plans, job.run_dir
        result: dict = {}
        error: list[BaseException] = []
        stop = stop or threading.Event()

        def target() -> None:
            try:
                result["reports"] = launch_local_ranks(plans, job.options, warmup=job.warmup,
                                                      fallback=job.fallback, stop=stop)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                error.append(exc)

        t0 = time.perf_counter()
        th = threading.Thread(target=target, name="reshardctl-session", daemon=True)
        world = job.inp.topology.world
        with _Signals(stop) as signals:
            th.start()
            total = len(plans) * (job.warmup + job.options.iterations) * world
            while th.is_alive():
                th.join(timeout=0.25)
                if progress is not None:
                    ready = ranks_with_phase(events_dir(run_dir), "materialise")
                    if ready < world:
                        progress(ready, world, "set-up: ranks with weights ready")
                    else:
                        progress(min(total, count_commits(run_dir / "events")), total, "refits: rank commits")
        wall = time.perf_counter() - t0
        reports = result.get("reports")
        err: ReshardError | None = None
        failures: list[dict] = []
        stopped_after = None
        interrupted = stop.is_set()
        if error:
            exc = error[0]
            if isinstance(exc, LocalRunError):
                err = exc
                reports = exc.session or {next(iter(plans)): exc.reports}
                failures = exc.failures
                stopped_after = exc.stopped_after_s
                interrupted = interrupted or exc.interrupted
            elif isinstance(exc, ReshardError):
                err = exc
            else:
                err = TransferError(f"local session failed: {type(exc).__name__}: {exc}")
        if interrupted:  # exit 130, as on Slurm (docs/runbook-faults.md, "Signals to reshardctl")
            by = f" by {signals.signame}" if signals.signame else ""
            err = Interrupted(f"interrupted{by}: stopped the {world} rank process(es); run directory {run_dir} "
                              f"(summary.json says so)")
        return Outcome(reports, err, wall, failures, interrupted, extra={"launcher_stopped_after_s": stopped_after})

    def recorded(self, run_dir: Path, job: str | None) -> bool:
        return False  # the default launcher: asked last

    def check_collect(self, run_dir: Path, job: str | None) -> None:
        """A local run writes its own summary; one whose launcher was killed outright is settled here."""
        read_run(run_dir)  # a FIFO or device as run.json: refused (InputError naming it) before anything runs
        settled = settle_local(run_dir)
        if settled is not None:
            raise LaunchError(f"{run_dir}: a local run whose launcher ended without a summary (killed outright); "
                              f"run.json now says {settled}")

    def collect(self, run_dir: Path, ctx: dict, *, wait: bool, job: str | None, on_state) -> Outcome:
        raise InputError(f"{run_dir}: not a Slurm run directory (no slurm/jobs.json)")  # a local run: none to collect

    def settle(self, run_dir: Path, live: dict, finish, read_context) -> str | None:
        return None  # settled by `reshardctl collect` (check_collect), whose launcher is gone


def settle_local(path: str | Path) -> str | None:
    """A local run left ``running`` by a launcher that is gone (killed outright: no summary): its
    ``run.json`` becomes ``interrupted``; returns the new state, or None when there is nothing to settle."""
    rec = read_run(path)
    if rec is None or rec.get("state") != "running" or launcher_alive(rec) is not False:
        return None
    pid = (rec.get("started_by") or {}).get("pid")
    for leftover in Path(path).glob(RANKS_PAYLOAD_PREFIX + "*.pickle"):
        leftover.unlink(missing_ok=True)
    settle(path, "interrupted", f"the launcher (pid {pid}) ended without writing a final state")
    return "interrupted"
