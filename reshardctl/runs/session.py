"""A refit session: plan the transports, launch the ranks (here or on Slurm), summarise, keep the record.

``run_session`` is what `reshardctl run` (one transport) and `reshardctl bench` (all three on the same
processes, with the raw-transfer ceiling) call. Pure planning first (every input problem is reported
before a process starts or a job is submitted), then the only side effects: the run directory, and the
rank processes (``launch/local.py``) or the Slurm jobs (``launch/slurm.py``).

The run directory's ``session.json`` holds everything the summary needs besides the ranks' reports, so
a detached Slurm run is summarised later by ``collect_session(run_dir)`` exactly as an attached one.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reshardctl.errors import InputError, Interrupted, LaunchError, ReshardError, TransferError
from reshardctl.plan.cost import lower_bound, predict
from reshardctl.plan.inputs import Inputs
from reshardctl.plan.model import Plan
from reshardctl.plan.planner import build_plan
from reshardctl.plan.report import infer_needed_bytes, inputs_json, transport_report
from reshardctl.plan.serialize import save_plan
from reshardctl.runs.rundir import new_run_dir, write_command, write_json
from reshardctl.runs.summary import speedups, summarize_transport

MAX_LOCAL_RANKS = 32  # processes the local launcher will start on one machine
LAUNCHERS = ("local", "slurm")
SESSION_JSON = "session.json"


@dataclass
class SessionResult:
    run_dir: Path
    summary: dict | None  # None: a detached Slurm run (collect it later)
    error: ReshardError | None = None
    plans: dict[str, Plan] = field(default_factory=dict)
    slurm: object | None = None  # the SlurmRun of a Slurm session

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_transports(inp: Inputs, transports: list[str], launcher: str = "local") -> dict[str, Plan]:
    world = inp.topology.world
    if launcher == "local" and world > MAX_LOCAL_RANKS:
        raise InputError(
            f"the local launcher runs every rank as a process on this machine: trainer {inp.topology.train_world} + "
            f"inference {inp.topology.infer_world} = {world} ranks is more than {MAX_LOCAL_RANKS}; "
            f"choose smaller layouts, run it on Slurm (--launcher slurm), or plan it with `reshardctl plan`"
        )
    return {
        t: build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=t, bucket_bytes=inp.bucket_bytes,
                      relay=inp.relay)
        for t in transports
    }


def _count_commits(events_dir: Path) -> int:
    return sum(commits_by_side(events_dir).values())


def commits_by_side(events_dir: Path) -> dict[str, int]:
    """Commit events written so far, per side (``{"train": n, "infer": m}``): a run's live progress."""
    out = {"train": 0, "infer": 0}
    for f in events_dir.glob("rank-*.jsonl"):
        try:
            text = f.read_text()
        except OSError:
            continue
        n = text.count('"phase":"commit"')
        if n:
            out["infer" if '"side":"infer"' in text else "train"] += n
    return out


def session_context(inp: Inputs, plans: dict[str, Plan], *, iterations: int, warmup: int, launcher: str,
                    run_dir: Path, command: str) -> dict:
    """Everything ``summary.json`` needs besides the ranks' reports (``session.json``)."""
    lb = lower_bound(next(iter(plans.values())), inp.links)
    needed = infer_needed_bytes(inp.model, inp.infer)
    return {
        "format": "reshardctl-session/1",
        "run_dir": str(run_dir),
        "command": command,
        "inputs": inputs_json(inp),
        "iterations": iterations,
        "warmup": warmup,
        "launcher": launcher,
        "world": inp.topology.world,
        "transports": {
            t: {"bytes_needed": needed, "predicted_s": predict(p, inp.links).predicted_s, "lower_bound_s": lb.seconds,
                "bucket_bytes": p.bucket_bytes, "fingerprint": p.fingerprint}
            for t, p in plans.items()
        },
    }


def build_summary(ctx: dict, reports: dict | None, *, error: ReshardError | None, wall_s: float,
                  extra: dict | None = None) -> dict:
    """``summary.json`` from the session context and the ranks' reports (``{transport: [RankReport]}``)."""
    summaries = {
        t: summarize_transport(t, (reports or {}).get(t, []), **c) for t, c in ctx["transports"].items()
    }
    summary = {
        "run_dir": ctx["run_dir"],
        "command": ctx["command"],
        "inputs": ctx["inputs"],
        "launcher": ctx.get("launcher", "local"),
        "iterations": ctx["iterations"],
        "warmup": ctx["warmup"],
        "wall_s": wall_s,
        "ok": error is None,
        "error": None if error is None else str(error),
        "transports": summaries,
        "speedup_vs_reshard": speedups(summaries),
    }
    summary.update(extra or {})
    return summary


def _prepare(inp: Inputs, transports: list[str], *, iterations: int, warmup: int, out: str | None,
             checkpoint: str | None, argv: list[str] | None, launcher: str):
    if iterations < 1 or warmup < 0:
        raise InputError(f"--iters must be >= 1 and --warmup >= 0 (got {iterations}, {warmup})")
    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    plans = plan_transports(inp, transports, launcher)
    if checkpoint is not None:
        from reshardctl.runtime.weights import check_checkpoint

        check_checkpoint(inp.model, checkpoint)
    run_dir = new_run_dir(out, "bench" if len(transports) > 1 else transports[0])
    if launcher == "slurm":
        run_dir = run_dir.resolve()  # every node must find it
    write_command(run_dir, argv)
    lb = lower_bound(next(iter(plans.values())), inp.links)
    plan_rows = {}
    for t, p in plans.items():
        save_plan(p, run_dir / f"plan-{t}.npz")
        plan_rows[t] = transport_report(p, inp.links, lb)
    write_json(run_dir / "plan.json", {"inputs": inputs_json(inp), "lower_bound_s": lb.seconds,
                                       "lower_bound_reason": lb.reason, "transports": plan_rows})
    ctx = session_context(inp, plans, iterations=iterations, warmup=warmup, launcher=launcher, run_dir=run_dir,
                          command=(run_dir / "command.txt").read_text().strip())
    write_json(run_dir / SESSION_JSON, ctx)
    return plans, run_dir, ctx


def run_session(
    inp: Inputs,
    transports: list[str],
    *,
    iterations: int,
    warmup: int = 1,
    baseline: bool = False,
    out: str | None = None,
    checkpoint: str | None = None,
    full_check: bool = False,
    argv: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    launcher: str = "local",
    slurm_mode: str | None = None,
    detach: bool = False,
    on_slurm_state: Callable[[dict], None] | None = None,
) -> SessionResult:
    """Plan, launch, summarise. Never raises for a failed refit: the result carries the error (and
    summary.json says what failed); raises ``InputError`` for bad inputs before anything starts, and
    ``LaunchError`` when Slurm refuses the jobs. ``detach`` (Slurm only): return once submitted."""
    from reshardctl.runtime.contract import RunOptions

    if detach and launcher != "slurm":
        raise InputError("--detach needs the Slurm launcher (--launcher slurm, or launcher: slurm in the profile)")
    plans, run_dir, ctx = _prepare(inp, transports, iterations=iterations, warmup=warmup, out=out,
                                   checkpoint=checkpoint, argv=argv, launcher=launcher)
    site = inp.site
    options = RunOptions(
        run_dir=str(run_dir), iterations=iterations, timeout_s=site.refit.timeout_s,
        rendezvous_timeout_s=site.refit.rendezvous_timeout_s, checkpoint=checkpoint, full_check=full_check,
        baseline=baseline,
    )
    total = len(plans) * (warmup + iterations) * inp.topology.world
    if launcher == "slurm":
        return _run_slurm(inp, plans, run_dir, ctx, options, warmup, slurm_mode=slurm_mode, detach=detach,
                          progress=progress, total=total, on_state=on_slurm_state)
    return _run_local(plans, run_dir, ctx, options, warmup, progress=progress, total=total)


def slurm_files(inp: Inputs, plans: dict[str, Plan], run_dir: Path, *, command: str, iterations: int = 5,
                warmup: int = 1, slurm_mode: str | None = None) -> dict[str, str | bytes]:
    """What `reshardctl plan --out DIR` adds for submitting by hand: ``slurm/<scripts>``, ``session.pkl``
    (the ranks' plans and options) and ``session.json`` (for `reshardctl collect DIR --job ID`), all for
    ``run_dir`` (absolute) as the run directory."""
    from reshardctl.launch.slurm import session_bytes
    from reshardctl.launch.slurm_request import SESSION_FILE, build_request
    from reshardctl.runtime.contract import RunOptions

    label = "bench" if len(plans) > 1 else next(iter(plans))
    req = build_request(inp.site, inp.topology, str(run_dir), mode=slurm_mode, label=label, python=sys.executable)
    site = inp.site
    options = RunOptions(run_dir=str(run_dir), iterations=iterations, timeout_s=site.refit.timeout_s,
                         rendezvous_timeout_s=site.refit.rendezvous_timeout_s)
    ctx = session_context(inp, plans, iterations=iterations, warmup=warmup, launcher="slurm", run_dir=run_dir,
                          command=command)
    files: dict[str, str | bytes] = {f"slurm/{n}": t for n, t in req.materialize().items()}
    files[SESSION_FILE] = session_bytes(plans, options, warmup)
    files[SESSION_JSON] = json.dumps(ctx, indent=2, default=str) + "\n"
    return files


def _run_local(plans, run_dir: Path, ctx: dict, options, warmup: int, *, progress, total: int) -> SessionResult:
    from reshardctl.launch.local import LocalRunError, run_local_session

    result: dict = {}
    error: list[BaseException] = []

    def target() -> None:
        try:
            result["reports"] = run_local_session(plans, options, warmup=warmup)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            error.append(exc)

    t0 = time.perf_counter()
    th = threading.Thread(target=target, name="reshardctl-session", daemon=True)
    th.start()
    while th.is_alive():
        th.join(timeout=0.25)
        if progress is not None:
            progress(min(total, _count_commits(run_dir / "events")), total)
    wall = time.perf_counter() - t0
    reports = result.get("reports")
    err: ReshardError | None = None
    if error:
        exc = error[0]
        if isinstance(exc, LocalRunError):
            err = exc
            reports = exc.session or {next(iter(plans)): exc.reports}
        elif isinstance(exc, ReshardError):
            err = exc
        else:
            err = TransferError(f"local session failed: {type(exc).__name__}: {exc}")
    summary = build_summary(ctx, reports, error=err, wall_s=wall)
    write_json(run_dir / "summary.json", summary)
    return SessionResult(run_dir, summary, err, plans)


def _run_slurm(inp: Inputs, plans, run_dir: Path, ctx: dict, options, warmup: int, *, slurm_mode, detach: bool,
               progress, total: int, on_state) -> SessionResult:
    from reshardctl.launch import slurm
    from reshardctl.launch.slurm_request import build_request
    from reshardctl.runs.index import record_run

    label = "bench" if len(plans) > 1 else next(iter(plans))
    request = build_request(inp.site, inp.topology, str(run_dir), mode=slurm_mode, label=label,
                            python=sys.executable)
    slurm.write_session(run_dir, plans, options, warmup)
    t0 = time.perf_counter()
    run = slurm.submit(request)
    record_run({"run_dir": str(run_dir), "site": inp.site.name, "mode": run.mode, "job_ids": run.job_ids,
                "submitted_at": run.submitted_at, "detached": detach})
    if detach:
        return SessionResult(run_dir, None, None, plans, slurm=run)

    def update(states: dict) -> None:
        if on_state is not None:
            on_state(states, commits_by_side(run_dir / "events"))
        if progress is not None:
            progress(min(total, _count_commits(run_dir / "events")), total)

    try:
        w = slurm.watch(run, update)
    except KeyboardInterrupt:  # watch() cancelled the jobs already
        w = slurm.Watch(slurm.final_states(run.ids, wait_s=5.0), None, time.time(), interrupted=True)
        summary, err = _slurm_summary(ctx, run, w, run_dir, time.perf_counter() - t0)
        write_json(run_dir / "summary.json", summary)
        raise Interrupted(f"interrupted: cancelled Slurm job(s) {', '.join(run.ids)}; "
                          f"run directory {run_dir} (summary.json says so)") from None
    summary, err = _slurm_summary(ctx, run, w, run_dir, time.perf_counter() - t0)
    write_json(run_dir / "summary.json", summary)
    return SessionResult(run_dir, summary, err, plans, slurm=run)


def _slurm_summary(ctx: dict, run, w, run_dir: Path, wall_s: float) -> tuple[dict, ReshardError | None]:
    from reshardctl.launch import slurm

    names = list(ctx["transports"])
    session, lost = slurm.read_reports(run_dir, ctx["world"], names)
    failed = [r for rs in session.values() for r in rs if not r.ok]
    msg = slurm.failure_message(run, w, lost, failed[:8])
    if w.interrupted:
        msg = f"interrupted: cancelled Slurm job(s) {', '.join(run.ids)}" + (f"\n{msg}" if msg else "")
    err = slurm.SlurmRunError(msg, session) if msg else None
    summary = build_summary(ctx, session, error=err, wall_s=wall_s,
                            extra={"slurm": slurm.slurm_record(run, w, run_dir)})
    if lost:
        summary["lost_ranks"] = {str(r): why for r, why in sorted(lost.items())}
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
        w = slurm.Watch(slurm.final_states(run.ids), None, time.time())
    summary, err = _slurm_summary(ctx, run, w, run_dir, time.perf_counter() - t0)
    summary["collected"] = True
    write_json(run_dir / "summary.json", summary)
    return SessionResult(run_dir, summary, err, {}, slurm=run)
