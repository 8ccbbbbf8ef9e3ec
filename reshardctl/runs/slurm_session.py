"""A refit session on Slurm (``runs/session.py`` prepares it): submit, watch, summarise; collect a
detached run later; and the Slurm files `reshardctl plan --out DIR` writes for submitting by hand."""

from __future__ import annotations

import json
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from reshardctl.errors import InputError, Interrupted, LaunchError, ReshardError
from reshardctl.plan.inputs import Inputs
from reshardctl.plan.model import Plan
from reshardctl.runs.rundir import mark_run
from reshardctl.runs.session import (
    SESSION_JSON,
    Prepared,
    SessionResult,
    _preparing,
    build_summary,
    commits_by_side,
    count_commits,
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
                            python=sys.executable)
    # the run's token travels in the private session file (never on a command line or in the script)
    options = replace(pre.options, token=secrets.token_hex(16))
    with _preparing(run_dir, pre.who, pre.started):  # a full disk: session.pkl named, nothing submitted
        slurm.write_session(run_dir, plans, options, warmup, fallback=pre.fallback)
    t0 = time.perf_counter()
    run = slurm.submit(request)
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
        w = slurm.watch(run, update)
    except KeyboardInterrupt:  # watch() cancelled the jobs already
        w = slurm.Watch(slurm.final_states(run.ids, wait_s=5.0, components=run.components()), None, time.time(),
                        interrupted=True)
        _finish_slurm(pre.ctx, run, w, run_dir, time.perf_counter() - t0)
        raise Interrupted(f"interrupted: cancelled Slurm job(s) {', '.join(run.ids)}; "
                          f"run directory {run_dir} (summary.json says so)") from None
    summary, err = _finish_slurm(pre.ctx, run, w, run_dir, time.perf_counter() - t0)
    return SessionResult(run_dir, summary, err, plans, slurm=run)


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
    try:
        ctx = json.loads((run_dir / SESSION_JSON).read_text())
    except FileNotFoundError:
        raise InputError(f"{run_dir}: not a reshardctl run directory (no {SESSION_JSON})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{run_dir / SESSION_JSON}: unreadable ({exc})") from None
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
