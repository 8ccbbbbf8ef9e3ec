"""A refit session on this machine: plan the transports, launch the ranks, summarise, keep the record.

``run_session`` is what `reshardctl run` (one transport) and `reshardctl bench` (all three on the same
processes, with the raw-transfer ceiling) call. Pure planning first (every input problem is reported
before a process starts), then the only side effects: the run directory and the rank processes.
"""

from __future__ import annotations

import json
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
from reshardctl.runs.rundir import new_run_dir, write_command, write_json
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
                      relay=inp.relay, broadcast_span=inp.broadcast_span)
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
) -> SessionResult:
    """Plan, launch, summarise. Never raises for a failed refit: the result carries the error (and
    summary.json says what failed); raises ``InputError`` for bad inputs before anything starts."""
    from reshardctl.launch.local import LocalRunError, run_local_session
    from reshardctl.runtime.contract import RunOptions

    if iterations < 1 or warmup < 0:
        raise InputError(f"--iters must be >= 1 and --warmup >= 0 (got {iterations}, {warmup})")
    plans = plan_transports(inp, transports)
    if checkpoint is not None:
        from reshardctl.runtime.weights import check_checkpoint

        check_checkpoint(inp.model, checkpoint)
    run_dir = new_run_dir(out, "bench" if len(transports) > 1 else transports[0])
    write_command(run_dir, argv)
    lb = lower_bound(next(iter(plans.values())), inp.links)
    plan_rows = {}
    for t, p in plans.items():
        save_plan(p, run_dir / f"plan-{t}.npz")
        plan_rows[t] = transport_report(p, inp.links, lb)
    write_json(run_dir / "plan.json", {"inputs": inputs_json(inp), "lower_bound_s": lb.seconds,
                                       "lower_bound_reason": lb.reason, "transports": plan_rows})
    site = inp.site
    options = RunOptions(
        run_dir=str(run_dir), iterations=iterations, timeout_s=site.refit.timeout_s,
        rendezvous_timeout_s=site.refit.rendezvous_timeout_s, checkpoint=checkpoint, full_check=full_check,
        baseline=baseline,
    )
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
    total = len(plans) * (warmup + iterations) * inp.topology.world
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
    needed = infer_needed_bytes(inp.model, inp.infer)
    summaries = {}
    for t, p in plans.items():
        pred = predict(p, inp.links)
        summaries[t] = summarize_transport(
            t, (reports or {}).get(t, []), bytes_needed=needed, predicted_s=pred.predicted_s,
            lower_bound_s=lb.seconds, bucket_bytes=p.bucket_bytes, fingerprint=p.fingerprint,
            predicted_breakdown_s=pred.breakdown,
        )
    summary = {
        "run_dir": str(run_dir),
        "command": (run_dir / "command.txt").read_text().strip(),
        "inputs": inputs_json(inp),
        "iterations": iterations,
        "warmup": warmup,
        "wall_s": wall,
        "ok": err is None,
        "error": None if err is None else str(err),
        "cost_figures": inp.links.source,
        "transports": summaries,
        "speedup_vs_reshard": speedups(summaries),
    }
    write_json(run_dir / "summary.json", summary)
    return SessionResult(run_dir, summary, err, plans)


def load_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())
