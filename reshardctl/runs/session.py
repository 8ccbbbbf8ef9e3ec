"""A refit session on this machine: plan the transports, launch the ranks, summarise, keep the record.

``run_session`` is what `reshardctl run` (one transport) and `reshardctl bench` (all three on the same
processes, with the raw-transfer ceiling) call. Pure planning first (every input problem is reported
before a process starts), then the only side effects: the run directory and the rank processes.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reshardctl.errors import InputError, ReshardError, TransferError
from reshardctl.plan.cost import lower_bound, predict
from reshardctl.plan.inputs import Inputs
from reshardctl.plan.model import Plan
from reshardctl.plan.planner import build_plan
from reshardctl.plan.report import infer_needed_bytes, inputs_json, transport_report
from reshardctl.plan.serialize import save_plan
from reshardctl.runs.rundir import mark_run, new_run_dir, run_state, started_by, write_command, write_json
from reshardctl.runs.summary import speedups, summarize_transport

MAX_LOCAL_RANKS = 32  # processes the local launcher will start on one machine


@dataclass
class SessionResult:
    run_dir: Path
    summary: dict
    error: ReshardError | None = None
    plans: dict[str, Plan] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_transports(inp: Inputs, transports: list[str]) -> dict[str, Plan]:
    world = inp.topology.world
    if world > MAX_LOCAL_RANKS:
        raise InputError(
            f"the local launcher runs every rank as a process on this machine: trainer {inp.topology.train_world} + "
            f"inference {inp.topology.infer_world} = {world} ranks is more than {MAX_LOCAL_RANKS}; "
            f"choose smaller layouts (or plan it with `reshardctl plan`)"
        )
    return {
        t: build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=t, bucket_bytes=inp.bucket_bytes,
                      relay=inp.relay)
        for t in transports
    }


def _count_commits(events_dir: Path) -> int:
    n = 0
    for f in events_dir.glob("rank-*.jsonl"):
        try:
            n += f.read_text().count('"phase":"commit"')
        except OSError:
            pass
    return n


def _events_of(run_dir: Path) -> list[dict]:
    from reshardctl.runtime.events import read_events

    out = []
    for f in sorted((run_dir / "events").glob("rank-*.jsonl")):
        try:
            out += read_events(f)
        except (OSError, ValueError):
            pass
    return out


def _set_up_done(events_dir: Path) -> int:
    """Ranks whose weights are materialised (set-up progress)."""
    n = 0
    for f in events_dir.glob("rank-*.jsonl"):
        try:
            n += '"phase":"materialise"' in f.read_text()
        except OSError:
            pass
    return n


def failure_summary(failures: list[dict], run_dir: Path, timeout_s: float) -> dict:
    """Root cause first, knock-on failures counted, and detection times measured from the drill (or the
    root cause's own time) to each survivor's failure record."""
    drills = [e for e in _events_of(run_dir) if e.get("phase") == "drill"]
    t0 = min((e["start"] for e in drills), default=None)
    if t0 is None and failures and failures[0].get("at"):
        t0 = failures[0]["at"]
    rows = []
    for k, f in enumerate(failures):
        row = {key: f.get(key) for key in ("rank", "host", "side", "side_rank", "phase", "step", "round", "peers",
                                           "error", "message")}
        row["root_cause"] = k == 0
        row["knock_on"] = k > 0
        if t0 is not None and f.get("at") and f.get("error") != "RankLost":
            row["detected_after_s"] = round(f["at"] - t0, 3)
        rows.append(row)
    detected = [r["detected_after_s"] for r in rows if "detected_after_s" in r]
    return {
        "root_cause": rows[0] if rows else None,
        "knock_on_failures": max(0, len(rows) - 1),
        "failures": rows,
        "drills": [{"rank": e.get("rank"), "drill": e.get("drill"), "at": e.get("start")} for e in drills],
        "detection_s": max(detected) if detected else None,
        "timeout_s": timeout_s,
    }


class _Signals:
    """SIGTERM/SIGINT/SIGHUP set ``stop`` (the launcher then kills the ranks and the session writes an
    interrupted summary); restored on exit. Only in the main thread (signals cannot be set elsewhere)."""

    def __init__(self, stop: threading.Event):
        self.stop, self.old = stop, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self.old[sig] = signal.signal(sig, lambda *_: self.stop.set())
        return self

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)


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
    progress: Callable[[int, int, str], None] | None = None,
    inject: list[str] | None = None,
    retries: int = 0,
    on_failure: str = "abort",
    timeout_s: float | None = None,
    stop: threading.Event | None = None,
) -> SessionResult:
    """Plan, check memory, launch, summarise. Never raises for a failed refit: the result carries the
    error (and summary.json says what failed, root cause first); raises ``InputError`` for bad inputs
    (including a run that cannot fit in memory and a bad ``--inject``) before anything starts."""
    from reshardctl.launch.local import LocalRunError, run_local_session
    from reshardctl.runs.memory_check import check_memory
    from reshardctl.runtime.contract import RunOptions
    from reshardctl.runtime.drills import check_ranks, parse_faults

    if iterations < 1 or warmup < 0:
        raise InputError(f"--iters must be >= 1 and --warmup >= 0 (got {iterations}, {warmup})")
    if retries < 0:
        raise InputError(f"--retries must be >= 0 (got {retries})")
    if on_failure not in ("abort", "fallback"):
        raise InputError(f"--on-failure {on_failure!r}: use abort or fallback")
    faults = ";".join(inject or []) or None
    check_ranks(parse_faults(faults), inp.topology.world)
    plans = plan_transports(inp, transports)
    fallback = None
    if on_failure == "fallback":  # decided before any attempt: every rank holds both plans from the start
        fallback = plans.get("gather_broadcast") or plan_transports(inp, ["gather_broadcast"])["gather_broadcast"]
    if checkpoint is not None:
        from reshardctl.runtime.weights import check_checkpoint

        check_checkpoint(inp.model, checkpoint)
    from reshardctl.launch.local import choose_local_backend

    memory = check_memory(plans, gpus=choose_local_backend(inp.topology.world, "auto") == "nccl")
    run_dir = new_run_dir(out, "bench" if len(transports) > 1 else transports[0])
    who, started = started_by(), time.time()
    mark_run(run_dir, "running", who, started)
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
    result: dict = {}
    error: list[BaseException] = []
    stop = stop or threading.Event()

    def target() -> None:
        try:
            result["reports"] = run_local_session(plans, options, warmup=warmup, fallback=fallback, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            error.append(exc)

    t0 = time.perf_counter()
    th = threading.Thread(target=target, name="reshardctl-session", daemon=True)
    world = inp.topology.world
    with _Signals(stop):
        th.start()
        total = len(plans) * (warmup + iterations) * world
        while th.is_alive():
            th.join(timeout=0.25)
            if progress is not None:
                ready = _set_up_done(run_dir / "events")
                if ready < world:
                    progress(ready, world, "set-up: ranks with weights ready")
                else:
                    progress(min(total, _count_commits(run_dir / "events")), total, "refits: rank commits")
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
    if interrupted and err is None:
        err = TransferError("interrupted")
    needed = infer_needed_bytes(inp.model, inp.infer)
    summaries = {}
    for t, p in plans.items():
        pred = predict(p, inp.links)
        reps = (reports or {}).get(t, [])
        summaries[t] = summarize_transport(
            t, reps, bytes_needed=needed, predicted_s=pred.predicted_s,
            lower_bound_s=lb.seconds, bucket_bytes=p.bucket_bytes, fingerprint=p.fingerprint,
        )
        if (failures or interrupted) and t == _failed_transport(reports, plans):
            summaries[t]["failures"] = failure_summary(failures, run_dir, timeout)["failures"]
            summaries[t]["verified"] = False
    fs = failure_summary(failures, run_dir, timeout) if failures else None
    summary = {
        "run_dir": str(run_dir),
        "command": (run_dir / "command.txt").read_text().strip(),
        "started_by": who,
        "inputs": inputs_json(inp),
        "iterations": iterations,
        "warmup": warmup,
        "wall_s": wall,
        "ok": err is None,
        "interrupted": interrupted,
        "error": None if err is None else str(err),
        "root_cause": fs["root_cause"] if fs else None,
        "knock_on_failures": fs["knock_on_failures"] if fs else 0,
        "detection_s": fs["detection_s"] if fs else None,
        "drills": fs["drills"] if fs else [],
        "launcher_stopped_after_s": stopped_after,
        "timeout_s": timeout,
        "retries": retries,
        "on_failure": on_failure,
        "memory_estimate_bytes": memory["total"],
        "transports": summaries,
        "speedup_vs_reshard": speedups(summaries),
    }
    write_json(run_dir / "summary.json", summary)
    mark_run(run_dir, "interrupted" if interrupted else ("finished" if err is None else "failed"), who, started)
    return SessionResult(run_dir, summary, err, plans)


def _failed_transport(reports, plans) -> str | None:
    for t in plans:
        if any(not r.ok for r in (reports or {}).get(t, [])):
            return t
    return next(iter(plans), None)


def load_summary(run_dir: str | Path) -> dict:
    """summary.json; for a run whose launcher was killed before writing it, a summary that says the run
    was interrupted (``run.json`` still says running, its launcher is gone)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file() and run_state(run_dir) == "interrupted":
        return {"run_dir": str(run_dir), "ok": False, "interrupted": True,
                "error": "interrupted: the launcher was killed before it wrote summary.json"}
    return json.loads(path.read_text())
