"""A refit session: plan the transports, launch the ranks, summarise, keep the record.

``run_refit_session`` is what `reshardctl run` (one transport) and `reshardctl bench` (all three on the same
processes, with the raw-transfer ceiling) call. Pure planning first (every input problem is reported
before a process starts or a job is submitted), then the only side effects: the run directory, and what
the session's launcher starts (``launch/launcher.py``: one interface, the launcher looked up by name; the
session never asks which one it holds). The launcher returns an ``Outcome``; ``finish`` writes
``summary.json`` and ``run.json`` from it.

The run directory's ``session.json`` holds everything the summary needs besides the ranks' reports, so
a detached run is summarised later by ``runs/collect.collect_session(run_dir)`` exactly as an attached one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reshardctl.errors import InputError, RecordError, ReshardError
from reshardctl.launch.launcher import DEFAULT, Launcher, LaunchJob, Outcome, launcher_for
from reshardctl.plan.cost import predict
from reshardctl.plan.lower_bound import lower_bound
from reshardctl.request.resolve import Inputs
from reshardctl.plan.refit_plan import Plan
from reshardctl.plan.planner import build_plan
from reshardctl.plan_report import infer_needed_bytes, inputs_json, transport_report
from reshardctl.plan_files.serialize import save_plan
from reshardctl.runs.rundir import (check_out_dir, mark_run, new_run_dir, private_umask, started_by, write_command,
                                    write_json)
from reshardctl.runs.checkpoint_check import check_checkpoint
from reshardctl.runs.failures import drill_rows, failure_summary
from reshardctl.runs.record import full_record, static_record, write_record
from reshardctl.runs.records import SESSION_JSON, events_dir, unreadable_logs, write_session, write_summary_json
from reshardctl.runs.summary import speedups, summarize_transport
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.drills import check_drills, parse_faults
from reshardctl.runtime.env import check_backend_env



@dataclass
class SessionResult:
    run_dir: Path
    summary: dict | None  # None: a detached Slurm run (collect it later)
    error: ReshardError | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    launched: object | None = None  # what the launcher started (a SlurmRun: its mode and job ids)

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_transports(inp: Inputs, transports: list[str], launcher: str = DEFAULT) -> dict[str, Plan]:
    """The plans of ``transports``, after ``launcher`` (a name) said it can run these worlds."""
    launcher_for(launcher).check(inp.topology)
    return _plans(inp, transports)


def _plans(inp: Inputs, transports: list[str]) -> dict[str, Plan]:
    return {
        t: build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=t, bucket_bytes=inp.bucket_bytes,
                      relay=inp.relay, broadcast_span=inp.broadcast_span)
        for t in transports
    }


def session_context(inp: Inputs, plans: dict[str, Plan], *, iterations: int, warmup: int, launcher: str,
                    run_dir: Path, command: str, timeout_s: float | None = None, retries: int = 0,
                    on_failure: str = "abort", who: dict | None = None, memory_bytes: int | None = None,
                    faults: str | None = None, transport_source: dict | None = None) -> dict:
    """Everything ``summary.json`` needs besides the ranks' reports (``session.json``). ``transport_source``:
    who chose the run's first transport (``runbook/transport_source.py``: the flag, the ledger entry, the profile)."""
    lb = lower_bound(next(iter(plans.values())), inp.links)
    needed = infer_needed_bytes(inp.model, inp.infer)
    return {
        "format": "reshardctl-session/1",
        "run_dir": str(run_dir),
        "command": command,
        "started_by": who,
        "inputs": inputs_json(inp),
        "request": None if inp.request is None else inp.request.to_json(),  # the runbook re-plans from it
        "iterations": iterations,
        "warmup": warmup,
        "launcher": launcher,
        "world": inp.topology.world,
        "timeout_s": inp.site.refit.timeout_s if timeout_s is None else timeout_s,
        "retries": retries,
        "on_failure": on_failure,
        "transport_source": transport_source,
        "faults": faults,  # the --inject drills, joined with ';' (summary.json lists each and whether it fired)
        "memory_estimate_bytes": memory_bytes,
        "cost_figures": inp.links.source,
        "transports": {t: _transport_context(p, inp, needed, lb.seconds) for t, p in plans.items()},
    }


def _transport_context(plan: Plan, inp: Inputs, needed: int, lower_bound_s: float) -> dict:
    pred = predict(plan, inp.links, land=False)  # run's ranks commit by swapping their arena: nothing lands
    return {"bytes_needed": needed, "predicted_s": pred.predicted_s, "predicted_breakdown_s": pred.breakdown,
            "predicted_phases_s": pred.phases, "lower_bound_s": lower_bound_s, "bucket_bytes": plan.bucket_bytes, "fingerprint": plan.fingerprint}


def build_summary(ctx: dict, reports: dict | None, *, error: ReshardError | None, wall_s: float,
                  failures: list[dict] | None = None, interrupted: bool = False, run_dir: Path | None = None,
                  extra: dict | None = None) -> dict:
    """``summary.json`` from the session context and the ranks' reports (``{transport: [RankReport]}``):
    root cause first, knock-on failures counted (``failures``, from the launcher)."""
    failures = failures or []
    summaries = {
        t: summarize_transport(t, (reports or {}).get(t, []), **c) for t, c in ctx["transports"].items()
    }
    timeout = ctx.get("timeout_s")
    drills = drill_rows(ctx.get("faults"), run_dir)
    fs = failure_summary(failures, drills, timeout) if (failures and run_dir is not None) else None
    if failures or interrupted:
        t = _failed_transport(reports, list(ctx["transports"]))
        if t is not None:
            if fs:
                summaries[t]["failures"] = fs["failures"]
            summaries[t]["verified"] = False
    summary = {
        "run_dir": ctx["run_dir"],
        "command": ctx["command"],
        "started_by": ctx.get("started_by"),
        "inputs": ctx["inputs"],
        "request": ctx.get("request"),
        "launcher": ctx.get("launcher", DEFAULT),
        "iterations": ctx["iterations"],
        "warmup": ctx["warmup"],
        "wall_s": wall_s,
        "ok": error is None,
        "interrupted": interrupted,
        "error": None if error is None else str(error),
        "root_cause": fs["root_cause"] if fs else None,
        "knock_on_failures": fs["knock_on_failures"] if fs else 0,
        "detection_s": fs["detection_s"] if fs else None,
        "drills": drills,
        "timeout_s": timeout,
        "retries": ctx.get("retries", 0),
        "on_failure": ctx.get("on_failure", "abort"),
        "memory_estimate_bytes": ctx.get("memory_estimate_bytes"),
        "cost_figures": ctx.get("cost_figures", "datasheet"),
        "transport_source": ctx.get("transport_source"),
        "transports": summaries,
        "speedup_vs_reshard": speedups(summaries),
        "record": full_record(ctx.get("record"), reports),
        # event logs the disk refused (the ranks went on without them): "<file>: <why> (<n> not written)";
        # event logs the readers skipped (a FIFO, a device, over the size bound): "<file>: <why> (skipped)"
        "record_errors": sorted({r.events_error for rs in (reports or {}).values() for r in rs if r.events_error}
                                | set(unreadable_logs(events_dir(run_dir)) if run_dir is not None else ())),
    }
    summary.update(extra or {})
    return summary


def write_summary(run_dir: Path, summary: dict) -> None:
    """``summary.json`` (first: on a nearly full disk the figures matter most), then ``record.json`` (with
    the ranks' hosts and backend; summary.json carries the same object)."""
    write_summary_json(run_dir, summary)
    if summary.get("record"):
        write_record(run_dir, summary["record"])


def _os_text(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)


def _result(summary: dict) -> dict:
    """The refit's outcome in a few hundred bytes, for ``run.json`` when ``summary.json`` cannot be written."""
    return {"ok": summary.get("ok"), "error": (summary.get("error") or "")[:600] or None,
            "transports": {t: {"verified": s.get("verified"), "iterations": s.get("iterations"),
                               "refit_median_s": (s.get("refit_s") or {}).get("median"),
                               "committed_steps_agree": s.get("committed_steps_agree")}
                           for t, s in (summary.get("transports") or {}).items()}}


def record_outcome(run_dir: Path, summary: dict, state: str, who: dict, started: float,
                   err: ReshardError | None) -> ReshardError | None:
    """Write ``summary.json`` and put ``run.json`` in its final ``state``, whatever the disk says: a write
    the disk refuses (full, read-only) is named in ``run.json`` (``record_error``), which then carries the
    refit's outcome itself (``result``; rewritten within its reserved bytes if need be, rundir.mark_run).
    Returns the session's error: ``err``, or a ``RecordError`` (exit 1) naming the file and saying what
    the ranks did."""
    problem = None
    try:
        write_summary(run_dir, summary)
    except OSError as exc:
        problem = _os_text(exc)
    extra = {"record_error": problem, "result": _result(summary)} if problem else {}
    try:
        mark_run(run_dir, state, who, started, **extra)
    except OSError as exc:
        problem = (f"{problem}; " if problem else "") + f"and {_os_text(exc)} (run.json keeps its previous state)"
    refused = summary.get("record_errors") or []
    incomplete = "; ".join(refused[:2]) + (f"; {len(refused) - 2} more event log(s) alike" if len(refused) > 2 else "")
    if problem is None and not incomplete:
        return err
    outcome = ("the refit committed on every rank (verified), but" if err is None and summary.get("ok")
               else f"the run failed ({err}), and")
    if problem is None:
        what = f"its record is incomplete: {incomplete}; summary.json says so (record_errors)"
    else:
        what = (f"its record could not be written: {problem}"
                + (f" (and {incomplete})" if incomplete else "") + "; "
                + ("run.json records the outcome and the file it could not write" if "run.json" not in problem
                   else "the summary printed here is all there is"))
    return RecordError(f"{outcome} {what}", hint=f"free space (or make it writable) under {run_dir} for the next run")


def _failed_transport(reports, names) -> str | None:
    for t in names:
        if any(not r.ok for r in (reports or {}).get(t, [])):
            return t
    return next(iter(names), None)


@contextmanager
def _preparing(run_dir: Path, who: dict, started: float) -> Iterator[None]:
    """The run directory's first files: a write the disk refuses (full, read-only) becomes a
    ``RecordError`` naming the file (exit 1), with ``run.json`` marked ``failed`` where it exists."""
    try:
        yield
    except OSError as exc:
        text = _os_text(exc)
        try:
            mark_run(run_dir, "failed", who, started, record_error=text)
        except OSError:
            pass
        raise RecordError(f"{text}: the run directory {run_dir} could not be prepared; nothing was started",
                          hint="free space (or make it writable), or choose another --out") from None


def _prepare(inp: Inputs, transports: list[str], *, iterations: int, warmup: int, baseline: bool,
             out: str | None, checkpoint: str | None, full_check: bool, argv: list[str] | None, launcher: str,
             inject: list[str] | None, retries: int, on_failure: str, timeout_s: float | None,
             force: bool = False, mode: str | None = None, detach: bool = False,
             transport_source: dict | None = None) -> tuple[Launcher, LaunchJob]:
    """Every check that can refuse the run (exit 2, nothing started), then the run directory, then what
    the launcher writes for its ranks."""
    if iterations < 1 or warmup < 0:
        raise InputError(f"--iters must be >= 1 and --warmup >= 0 (got {iterations}, {warmup})")
    if retries < 0:
        raise InputError(f"--retries must be >= 0 (got {retries})")
    if on_failure not in ("abort", "fallback"):
        raise InputError(f"--on-failure {on_failure!r}: use abort or fallback")
    impl = launcher_for(launcher)
    check_out_dir(out, force)
    check_backend_env()  # the ranks would refuse it: refused here, before anything starts
    faults = ";".join(inject or []) or None
    first_step = RunOptions.first_step  # the default the session keeps: one step per refit from there
    check_drills(parse_faults(faults), world=inp.topology.world, train_world=inp.topology.train_world,
                 first_step=first_step, last_step=first_step + len(transports) * (warmup + iterations) - 1)
    impl.check(inp.topology)
    plans = _plans(inp, transports)
    fallback = None
    if on_failure == "fallback":  # decided before any attempt: every rank holds both plans from the start
        fallback = plans.get("gather_broadcast") or _plans(inp, ["gather_broadcast"])["gather_broadcast"]
    if checkpoint is not None:
        check_checkpoint(inp.model, checkpoint)
    memory = impl.memory_estimate(inp, {**plans, **({"fallback": fallback} if fallback is not None else {})})
    # absolute: every Slurm node must find it, and summary.json names it wherever it is read
    run_dir = new_run_dir(out, "bench" if baseline else transports[0], force=force).resolve()
    who, started = started_by(), time.time()
    with _preparing(run_dir, who, started):  # a disk that refuses a file: named, run.json "failed"
        mark_run(run_dir, impl.starting_state, who, started)
        write_command(run_dir, argv)
        lb = lower_bound(next(iter(plans.values())), inp.links)
        plan_rows = {}
        for t, p in plans.items():
            save_plan(p, run_dir / f"plan-{t}.npz")
            (run_dir / f"plan-{t}.npz").chmod(0o600)
            plan_rows[t] = transport_report(p, inp.links, lb)
        write_json(run_dir / "plan.json", {"inputs": inputs_json(inp), "lower_bound_s": lb.seconds,
                                           "lower_bound_reason": lb.reason, "transports": plan_rows})
        site = inp.site
        timeout = timeout_s if timeout_s is not None else site.refit.timeout_s
        options = RunOptions(
            run_dir=str(run_dir), iterations=iterations, timeout_s=timeout,
            rendezvous_timeout_s=site.refit.rendezvous_timeout_s, checkpoint=checkpoint, full_check=full_check,
            baseline=baseline, faults=faults, retries=retries, on_failure=on_failure,
        )
        ctx = session_context(inp, plans, iterations=iterations, warmup=warmup, launcher=launcher, run_dir=run_dir,
                              command=(run_dir / "command.txt").read_text().strip(), timeout_s=timeout,
                              retries=retries, on_failure=on_failure, who=who, memory_bytes=memory, faults=faults,
                              transport_source=transport_source)
        ctx["record"] = static_record(site, started=started, timeout_s=timeout,
                                      rendezvous_timeout_s=site.refit.rendezvous_timeout_s, launcher=launcher)
        write_record(run_dir, ctx["record"])
        write_session(run_dir, ctx)
        job = LaunchJob(inp, plans, fallback, options, warmup, run_dir, ctx, who, started, mode=mode, detach=detach)
        impl.prepare(job)  # a full disk: the file named, nothing started
    return impl, job


def finish(ctx: dict, outcome: Outcome, run_dir: Path, *, who: dict, started: float,
           collected: bool = False) -> tuple[dict, ReshardError | None]:
    """``summary.json`` from the session context and the launcher's outcome, ``run.json`` in its final
    state; (summary, the session's error)."""
    summary = build_summary(ctx, outcome.reports, error=outcome.error, wall_s=outcome.wall_s,
                            failures=outcome.failures, interrupted=outcome.interrupted, run_dir=run_dir,
                            extra=outcome.extra)
    if collected:
        summary["collected"] = True
    state = "interrupted" if outcome.interrupted else ("finished" if outcome.error is None else "failed")
    at = ctx.get("started_at") or outcome.started_at or started  # a launcher's own start (Slurm: the submission)
    return summary, record_outcome(run_dir, summary, state, who, at, outcome.error)


def session_files(inp: Inputs, plans: dict[str, Plan], run_dir: Path, *, command: str, launcher: str,
                  iterations: int = 5, warmup: int = 1, mode: str | None = None) -> dict[str, str | bytes]:
    """What `reshardctl plan --out DIR` adds for starting the run by hand: the launcher's files (job
    scripts, the session file with a fresh run token) and ``session.json`` (for `reshardctl collect DIR
    --job ID`), all for ``run_dir`` (absolute) as the run directory."""
    ctx = session_context(inp, plans, iterations=iterations, warmup=warmup, launcher=launcher, run_dir=run_dir,
                          command=command)
    files = launcher_for(launcher).files(inp, plans, run_dir, iterations=iterations, warmup=warmup, mode=mode)
    files[SESSION_JSON] = json.dumps(ctx, indent=2, default=str) + "\n"
    return files


def run_refit_session(
    inp: Inputs,
    transports: list[str],
    *,
    iterations: int,
    warmup: int = 1,
    baseline: bool = False,
    out: str | None = None,
    force: bool = False,
    checkpoint: str | None = None,
    full_check: bool = False,
    argv: list[str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    inject: list[str] | None = None,
    retries: int = 0,
    on_failure: str = "abort",
    timeout_s: float | None = None,
    stop: threading.Event | None = None,
    launcher: str = DEFAULT,
    mode: str | None = None,
    detach: bool = False,
    on_state: Callable[[dict, dict], None] | None = None,
    transport_source: dict | None = None,
) -> SessionResult:
    """Plan, check, launch, summarise. Never raises for a failed refit: the result carries the error (and
    summary.json says what failed, root cause first); raises ``InputError`` for bad inputs (including a
    local run that cannot fit in memory and a bad ``--inject``) before anything starts, and ``LaunchError``
    when the launcher cannot start the ranks (Slurm refuses the jobs). ``detach``: return once started
    (where the launcher allows it); ``mode``: the launcher's own mode (Slurm: hetjob | two-jobs);
    ``on_state(states, commits per side)``: a queue's job states as they change (launchers with a queue);
    ``transport_source``: who chose the first transport (session.json and summary.json keep it)."""
    if detach:
        launcher_for(launcher).check_detach()
    with private_umask():  # the run directory, the ranks' files and Slurm's own files: private to the user
        impl, job = _prepare(inp, transports, iterations=iterations, warmup=warmup, baseline=baseline, out=out,
                             checkpoint=checkpoint, full_check=full_check, argv=argv, launcher=launcher,
                             inject=inject, retries=retries, on_failure=on_failure, timeout_s=timeout_s,
                             force=force, mode=mode, detach=detach, transport_source=transport_source)
        outcome = impl.run(job, progress=progress, stop=stop, on_state=on_state)
        if outcome.detached:
            return SessionResult(job.run_dir, None, None, dict(job.plans), launched=outcome.handle)
        with outcome.until_written or nullcontext():  # e.g. signals ignored until the summary is written
            summary, err = finish(job.ctx, outcome, job.run_dir, who=job.who, started=job.started)
        if outcome.raise_after is not None:
            raise outcome.raise_after
        return SessionResult(job.run_dir, summary, err, dict(job.plans), launched=outcome.handle)
