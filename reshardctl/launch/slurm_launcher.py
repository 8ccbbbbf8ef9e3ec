"""The Slurm launcher: submit the session's jobs, watch them, read the ranks' reports; collect a detached
run later, settle one whose launcher is gone; the files `reshardctl plan --out DIR` writes for submitting
by hand; the dry run (the job scripts and the sbatch argv, nothing written). Every Slurm command goes
through ``launch/slurm.py`` and ``slurm_cli.py``; the request is ``slurm_request.py`` (pure)."""

from __future__ import annotations

import secrets
import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

from reshardctl.errors import InputError, Interrupted, LaunchError, NotEnded, ReshardError
from reshardctl.launch import slurm
from reshardctl.launch.memory_check import check_slurm_memory
from reshardctl.launch.launcher import DryRun, LaunchJob, Outcome, Progress
from reshardctl.runs.records import commits_by_side, count_commits
from reshardctl.launch.slurm_failure import failure_message
from reshardctl.launch.slurm_request import build_request
from reshardctl.plan.refit_plan import Plan
from reshardctl.request.resolve import Inputs
from reshardctl.launch.run_index import list_runs, record_run
from reshardctl.runs.rundir import DEFAULT_BASE, launcher_alive, mark_run, read_run, settle
from reshardctl.runtime import time_limit
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.session_file import SESSION_FILE, session_bytes, write_session

UNSETTLED = ("submitting", "submitted")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to an attached Slurm run: handled as Ctrl-C (cancel, summary, exit 130)."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


class _TermAsInterrupt:
    """While watching the jobs, SIGTERM and SIGHUP raise ``Terminated`` (the first one; later ones are
    ignored while the jobs are cancelled and the summary written); ``ignore``: ignore them. Restored on
    exit; only in the main thread (signals cannot be set elsewhere)."""

    def __init__(self, ignore: bool = False):
        self.ignore, self.old = ignore, {}

    def _raise(self, signum, _frame):
        for sig in self.old:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signal.Signals(signum).name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self.old[sig] = signal.signal(sig, signal.SIG_IGN if self.ignore else self._raise)
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)


def _outcome(ctx: dict, run: slurm.SlurmRun, w: slurm.Watch, run_dir: Path, wall_s: float) -> Outcome:
    """The ranks' reports read back, why the run failed (if it did), the summary's ``slurm`` section."""
    names = list(ctx["transports"])
    cancelled = slurm.who_cancelled(run, w)  # by a person: the summary says who and when
    session, lost = slurm.read_reports(run_dir, ctx["world"], names, cancelled=cancelled is not None)
    failed = [r for rs in session.values() for r in rs if not r.ok]
    msg = failure_message(run, w, lost, failed, cancelled)
    if w.interrupted:
        msg = f"interrupted: cancelled Slurm job(s) {', '.join(run.ids)}" + (f"\n{msg}" if msg else "")
    err = slurm.SlurmRunError(msg, session) if msg else None
    extra = {"slurm": slurm.slurm_record(run, w, run_dir)}
    stopped = time_limit.record(session)  # the ranks stopped on the time-limit signal (slurm.signal)
    if stopped is not None:
        extra["slurm"].update(interrupted=True, time_limit=stopped)
    if lost:
        extra["lost_ranks"] = {str(r): why for r, why in sorted(lost.items())}
    return Outcome(session, err, wall_s, slurm.failure_records(session, lost, run_dir),
                   w.interrupted or cancelled is not None or stopped is not None, extra,
                   handle=run, started_at=run.submitted_at)


class SlurmLauncher:
    name = "slurm"
    starting_state = "submitting"

    def check(self, topology) -> None:
        return None  # the request (build_request) refuses what the profile's partitions cannot hold

    def check_detach(self) -> None:
        return None  # `reshardctl collect` summarises the run once its jobs ended

    def memory_estimate(self, inp: Inputs, plans: Mapping[str, Plan]) -> int | None:
        """The busiest node's bytes, checked against the profile's memory request (launch/memory_check.py)."""
        return check_slurm_memory(dict(plans), inp.site, inp.topology.gpus_per_node)

    def dry_run(self, inp: Inputs, transports: list[str], *, out: str | None, mode: str | None, baseline: bool,
                timeout_s: float | None, retries: int) -> DryRun:
        """The job scripts and the argv that would submit them, for the run directory that would be used."""
        label = "bench" if baseline else transports[0]  # as the run directory (runs/rundir.py) is named
        run_dir = Path(out) if out else Path(DEFAULT_BASE) / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{label}"
        req = build_request(inp.site, inp.topology, str(run_dir.absolute()), mode=mode, label=label,
                            python=sys.executable, timeout_s=timeout_s, retries=retries)
        scripts = req.materialize()
        return DryRun(req.mode, req.run_dir, scripts, {n: str(req.script_path(n)) for n in scripts},
                      [req.submit_argv(n, after="<trainer job id>" if n == "infer.sbatch" else None)
                       for n in scripts])

    def files(self, inp: Inputs, plans: Mapping[str, Plan], run_dir: Path, *, iterations: int, warmup: int,
              mode: str | None) -> dict[str, str | bytes]:
        """For submitting by hand (`reshardctl plan --out DIR`): ``slurm/<scripts>`` and the session file
        (the ranks' plans and options, with a fresh run token), for ``run_dir`` (absolute)."""
        label = "bench" if len(plans) > 1 else next(iter(plans))
        check_slurm_memory(dict(plans), inp.site, inp.topology.gpus_per_node)  # before anything is written
        req = build_request(inp.site, inp.topology, str(run_dir), mode=mode, label=label, python=sys.executable)
        site = inp.site
        options = RunOptions(run_dir=str(run_dir), iterations=iterations, timeout_s=site.refit.timeout_s,
                             rendezvous_timeout_s=site.refit.rendezvous_timeout_s, token=secrets.token_hex(16))
        files: dict[str, str | bytes] = {f"slurm/{n}": t for n, t in req.materialize().items()}
        files[SESSION_FILE] = session_bytes(plans, options, warmup)
        return files

    def prepare(self, job: LaunchJob) -> None:
        """The session file the ranks load, ``session.pkl``; the run's token travels in it (private, never
        on a command line or in the script)."""
        write_session(job.run_dir / SESSION_FILE, job.plans, replace(job.options, token=secrets.token_hex(16)),
                      job.warmup, job.fallback)

    def run(self, job: LaunchJob, *, progress: Progress | None, stop, on_state) -> Outcome:
        plans, run_dir, inp, options = job.plans, job.run_dir, job.inp, job.options
        request = build_request(inp.site, inp.topology, str(run_dir), mode=job.mode, label=job.label,
                                python=sys.executable, timeout_s=options.timeout_s, retries=options.retries)
        t0 = time.perf_counter()
        try:
            run = slurm.submit(request)
        except ReshardError as exc:  # refused by Slurm, or its ids not recorded (the jobs cancelled): run.json final
            try:
                mark_run(run_dir, "failed", job.who, job.started, error=str(exc)[:2000])
            except OSError:
                pass  # the error raised names the file the disk refused
            raise
        mark_run(run_dir, "submitted", job.who, job.started)
        record_run({"run_dir": str(run_dir), "site": inp.site.name, "mode": run.mode, "job_ids": run.job_ids,
                    "submitted_at": run.submitted_at, "detached": job.detach})
        if job.detach:
            return Outcome(None, None, 0.0, handle=run, detached=True)
        total = len(plans) * (job.warmup + options.iterations) * inp.topology.world

        def update(states: dict) -> None:  # the counts first: a state line said at once carries this poll's
            if progress is not None:
                progress(min(total, count_commits(run_dir / "events")), total, "refits: rank commits")
            if on_state is not None:
                on_state(states, commits_by_side(run_dir / "events"))

        try:
            with _TermAsInterrupt():
                w = slurm.watch(run, update)
        except KeyboardInterrupt as exc:  # watch() cancelled the jobs already
            # a second SIGTERM/SIGHUP cannot cut the summary short: ignored until the session wrote it
            shield = ExitStack()
            shield.enter_context(_TermAsInterrupt(ignore=True))
            try:
                w = slurm.Watch(slurm.final_states(run.ids, wait_s=5.0, components=run.components()), None,
                                time.time(), interrupted=True)
                out = _outcome(job.ctx, run, w, run_dir, time.perf_counter() - t0)
            except BaseException:
                shield.close()
                raise
            out.until_written = shield
            by = f" by {exc.signame}" if isinstance(exc, Terminated) else ""
            out.raise_after = Interrupted(f"interrupted{by}: cancelled Slurm job(s) {', '.join(run.ids)}; "
                                          f"run directory {run_dir} (summary.json says so)")
            return out
        return _outcome(job.ctx, run, w, run_dir, time.perf_counter() - t0)

    def recorded(self, run_dir: Path, job: str | None) -> bool:
        return job is not None or (run_dir / slurm.JOBS_FILE).exists()

    def check_collect(self, run_dir: Path, job: str | None) -> None:
        if job is not None:
            slurm.hand_job_ids(run_dir, job)  # job ids checked before anything is read or run
        read_run(run_dir)  # a FIFO or device as run.json: refused (InputError naming it) before anything runs

    def collect(self, run_dir: Path, ctx: dict, *, wait: bool, job: str | None,
                on_state: Callable[[dict], None] | None) -> Outcome:
        """The outcome of a (detached) Slurm run once its jobs ended; ``wait`` watches them until then.
        ``job``: the job id of a run submitted by hand from `reshardctl plan --out DIR` (recorded in
        ``slurm/jobs.json``). Raises ``LaunchError`` when the jobs still run and ``wait`` is off."""
        if job is not None:
            adopted = slurm.adopt(run_dir, job, world=ctx["world"])
            if not any(r["run_dir"] == str(run_dir) and r["job_ids"] == adopted.job_ids for r in list_runs()):
                record_run({"run_dir": str(run_dir), "site": (ctx.get("inputs") or {}).get("site"), "mode": adopted.mode,
                            "job_ids": adopted.job_ids, "submitted_at": adopted.submitted_at, "detached": True,
                            "by_hand": True})  # `reshardctl jobs` lists it from now on
        run = slurm.SlurmRun.load(run_dir)
        t0 = time.perf_counter()
        if wait:
            w = slurm.watch(run, on_state)
            w.first_running_at = None  # watched from now, not from the submission: use accounting's start
        else:
            live = slurm.job_states(run.ids)
            running = {j: s for j, s in live.items() if not s.terminal}
            if running:
                states = ", ".join(f"{j} {s.state}" for j, s in running.items())
                raise NotEnded(f"{run_dir}: the run has not ended (Slurm job {states}); nothing was collected",
                               hint="wait with `reshardctl collect --wait`, or stop it with `reshardctl cancel`")
            w = slurm.Watch(slurm.final_states(run.ids, components=run.components()), None, time.time())
        return _outcome(ctx, run, w, run_dir, time.perf_counter() - t0)

    def settle(self, run_dir: Path, live: dict, finish: Callable[[dict, Outcome], None],
               read_context: Callable[[Path], dict]) -> str | None:
        """A Slurm run whose ``run.json`` still says ``submitting``/``submitted`` although no launcher of it
        runs here (detached, or its launcher killed outright) and its jobs ended (``live``: the queue's
        states, ``slurm.job_states``; accounting must have every job's final record): collected
        (``finish`` writes the summary from ``read_context(run_dir)`` and the outcome), so that
        ``summary.json`` and ``run.json`` say how it ended. A run killed before its jobs were recorded
        becomes ``interrupted``. Returns the new state, or None when there is nothing to settle (yet)."""
        rec = read_run(run_dir)
        if rec is None or rec.get("state") not in UNSETTLED or launcher_alive(rec):
            return None
        try:
            run = slurm.SlurmRun.load(run_dir)
        except LaunchError:
            if rec.get("state") != "submitting" or launcher_alive(rec) is None:
                return None
            settle(run_dir, "interrupted", "the launcher ended before its jobs were recorded")
            return "interrupted"
        if any(j in live and not live[j].terminal for j in run.ids):
            return None
        states = slurm.final_states(run.ids, wait_s=0.0, components=run.components())
        if not all(j in states and states[j].terminal for j in run.ids):
            return None  # accounting has not recorded the end yet
        try:
            ctx = read_context(run_dir)
            finish(ctx, _outcome(ctx, run, slurm.Watch(states, None, time.time()), run_dir, 0.0))
        except (InputError, OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # not a run this tool can collect: `reshardctl collect` says why
        state = (read_run(run_dir) or {}).get("state", "failed")
        settle(run_dir, state, "its jobs ended and no launcher collected them", was=rec.get("state"))
        return state
