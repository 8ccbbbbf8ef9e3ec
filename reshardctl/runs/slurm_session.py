"""A refit session on Slurm (``runs/session.py`` prepares it): submit, watch, summarise; collect a
detached run later; and the Slurm files `reshardctl plan --out DIR` writes for submitting by hand."""

from __future__ import annotations

import json
import secrets
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from reshardctl.errors import InputError, Interrupted, LaunchError, ReshardError
from reshardctl.launch.slurm_cli import check_job_id
from reshardctl.request.resolve import Inputs
from reshardctl.plan.refit_plan import Plan
from reshardctl.runs.rundir import launcher_alive, mark_run, read_run, settle, settle_local
from reshardctl.runs.records import SESSION_JSON, commits_by_side, count_commits, read_session
from reshardctl.runs.session import (
    Prepared,
    SessionResult,
    _preparing,
    build_summary,
    record_outcome,
    session_context,
)


def slurm_files(inp: Inputs, plans: dict[str, Plan], run_dir: Path, *, command: str, iterations: int = 5,
                warmup: int = 1, slurm_mode: str | None = None) -> dict[str, str | bytes]:
    """What `reshardctl plan --out DIR` adds for submitting by hand: ``slurm/<scripts>``, ``session.pkl``
    (the ranks' plans and options, with a fresh run token) and ``session.json`` (for `reshardctl collect
    DIR --job ID`), all for ``run_dir`` (absolute) as the run directory."""
    from reshardctl.launch.slurm import session_bytes
    from reshardctl.launch.slurm_request import SESSION_FILE, build_request
    from reshardctl.runtime.contract import RunOptions

    label = "bench" if len(plans) > 1 else next(iter(plans))
    req = build_request(inp.site, inp.topology, str(run_dir), mode=slurm_mode, label=label, python=sys.executable)
    site = inp.site
    options = RunOptions(run_dir=str(run_dir), iterations=iterations, timeout_s=site.refit.timeout_s,
                         rendezvous_timeout_s=site.refit.rendezvous_timeout_s, token=secrets.token_hex(16))
    ctx = session_context(inp, plans, iterations=iterations, warmup=warmup, launcher="slurm", run_dir=run_dir,
                          command=command)
    files: dict[str, str | bytes] = {f"slurm/{n}": t for n, t in req.materialize().items()}
    files[SESSION_FILE] = session_bytes(plans, options, warmup)
    files[SESSION_JSON] = json.dumps(ctx, indent=2, default=str) + "\n"
    return files


def run_slurm(inp: Inputs, pre: Prepared, warmup: int, *, slurm_mode, detach: bool, progress,
               on_state) -> SessionResult:
    from reshardctl.launch import slurm
    from reshardctl.launch.slurm_request import build_request
    from reshardctl.runs.index import record_run

    plans, run_dir = pre.plans, pre.run_dir
    label = "bench" if pre.options.baseline else next(iter(plans))  # as the run directory is named
    request = build_request(inp.site, inp.topology, str(run_dir), mode=slurm_mode, label=label,
                            python=sys.executable, timeout_s=pre.options.timeout_s, retries=pre.options.retries)
    # the run's token travels in the private session file (never on a command line or in the script)
    options = replace(pre.options, token=secrets.token_hex(16))
    with _preparing(run_dir, pre.who, pre.started):  # a full disk: session.pkl named, nothing submitted
        slurm.write_session(run_dir, plans, options, warmup, fallback=pre.fallback)
    t0 = time.perf_counter()
    try:
        run = slurm.submit(request)
    except ReshardError as exc:  # refused by Slurm, or its ids not recorded (the jobs cancelled): run.json final
        try:
            mark_run(run_dir, "failed", pre.who, pre.started, error=str(exc)[:2000])
        except OSError:
            pass  # the error raised names the file the disk refused
        raise
    mark_run(run_dir, "submitted", pre.who, pre.started)
    record_run({"run_dir": str(run_dir), "site": inp.site.name, "mode": run.mode, "job_ids": run.job_ids,
                "submitted_at": run.submitted_at, "detached": detach})
    if detach:
        return SessionResult(run_dir, None, None, plans, slurm=run)
    total = len(plans) * (warmup + options.iterations) * inp.topology.world

    def update(states: dict) -> None:
        if on_state is not None:
            on_state(states, commits_by_side(run_dir / "events"))
        if progress is not None:
            progress(min(total, count_commits(run_dir / "events")), total, "refits: rank commits")

    try:
        with _TermAsInterrupt():
            w = slurm.watch(run, update)
    except KeyboardInterrupt as exc:  # watch() cancelled the jobs already
        with _TermAsInterrupt(ignore=True):  # a second SIGTERM/SIGHUP cannot cut the summary short
            w = slurm.Watch(slurm.final_states(run.ids, wait_s=5.0, components=run.components()), None,
                            time.time(), interrupted=True)
            _finish_slurm(pre.ctx, run, w, run_dir, time.perf_counter() - t0)
        by = f" by {exc.signame}" if isinstance(exc, Terminated) else ""
        raise Interrupted(f"interrupted{by}: cancelled Slurm job(s) {', '.join(run.ids)}; "
                          f"run directory {run_dir} (summary.json says so)") from None
    summary, err = _finish_slurm(pre.ctx, run, w, run_dir, time.perf_counter() - t0)
    return SessionResult(run_dir, summary, err, plans, slurm=run)


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


def _finish_slurm(ctx: dict, run, w, run_dir: Path, wall_s: float,
                  collected: bool = False) -> tuple[dict, ReshardError | None]:
    """Read the ranks' reports, build and write ``summary.json``, mark the run; (summary, error)."""
    from reshardctl.launch import slurm

    names = list(ctx["transports"])
    session, lost = slurm.read_reports(run_dir, ctx["world"], names)
    failed = [r for rs in session.values() for r in rs if not r.ok]
    msg = slurm.failure_message(run, w, lost, failed)
    if w.interrupted:
        msg = f"interrupted: cancelled Slurm job(s) {', '.join(run.ids)}" + (f"\n{msg}" if msg else "")
    err = slurm.SlurmRunError(msg, session) if msg else None
    failures = slurm.failure_records(session, lost, run_dir)
    summary = build_summary(ctx, session, error=err, wall_s=wall_s, failures=failures, interrupted=w.interrupted,
                            run_dir=run_dir, extra={"slurm": slurm.slurm_record(run, w, run_dir)})
    if lost:
        summary["lost_ranks"] = {str(r): why for r, why in sorted(lost.items())}
    if collected:
        summary["collected"] = True
    err = record_outcome(run_dir, summary, "interrupted" if w.interrupted else ("finished" if err is None else "failed"),
                         ctx.get("started_by") or {}, ctx.get("started_at") or run.submitted_at, err)
    return summary, err


def collect_session(run_dir: str | Path, *, wait: bool = False, job: str | None = None,
                    on_state: Callable[[dict], None] | None = None) -> SessionResult:
    """The summary of a (detached) Slurm run once its jobs ended; ``wait`` watches them until then.
    ``job``: the job id of a run submitted by hand from `reshardctl plan --out DIR` (recorded in
    ``slurm/jobs.json``). Raises ``LaunchError`` when the jobs still run and ``wait`` is off."""
    from reshardctl.launch import slurm

    run_dir = Path(run_dir)
    if job is not None:
        check_job_id(job, "--job")  # before anything is read or run
    read_run(run_dir)  # a FIFO or device as run.json: refused (InputError naming it) before anything runs
    if job is None and not (run_dir / slurm.JOBS_FILE).exists():
        settled = settle_local(run_dir)
        if settled is not None:
            raise LaunchError(f"{run_dir}: a local run whose launcher ended without a summary (killed outright); "
                              f"run.json now says {settled}")
    ctx = read_session(run_dir).context
    if job is not None:
        slurm.adopt(run_dir, job, world=ctx["world"])
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
            raise LaunchError(f"{run_dir}: the run has not ended (Slurm job {states})",
                              hint="wait with `reshardctl collect --wait`, or stop it with `reshardctl cancel`")
        w = slurm.Watch(slurm.final_states(run.ids, components=run.components()), None, time.time())
    summary, err = _finish_slurm(ctx, run, w, run_dir, time.perf_counter() - t0, collected=True)
    return SessionResult(run_dir, summary, err, {}, slurm=run)


UNSETTLED = ("submitting", "submitted")


def settle_slurm(run_dir: str | Path, live: dict) -> str | None:
    """A Slurm run whose ``run.json`` still says ``submitting``/``submitted`` although no launcher of it
    runs here (detached, or its launcher killed outright) and its jobs ended (``live``: the queue's
    states, ``slurm.job_states``; accounting must have every job's final record): collected, so that
    ``summary.json`` and ``run.json`` say how it ended. A run killed before its jobs were recorded
    becomes ``interrupted``. Returns the new state, or None when there is nothing to settle (yet)."""
    from reshardctl.launch import slurm

    run_dir = Path(run_dir)
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
        ctx = read_session(run_dir).context
        _finish_slurm(ctx, run, slurm.Watch(states, None, time.time()), run_dir, 0.0, collected=True)
    except (InputError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not a run this tool can collect: `reshardctl collect` says why
    state = (read_run(run_dir) or {}).get("state", "failed")
    settle(run_dir, state, "its jobs ended and no launcher collected them", was=rec.get("state"))
    return state
