"""What a report needs from one run directory: summary.json and the ranks' events, both read through
``runs/records.py`` (bounded, checked; a line that is not an event is counted, not fatal).

``events/rank-N.jsonl`` gives the per-iteration phase timeline and the bytes through each rank's
transfer phases (a trainer rank logs what it sent, an inference rank what it received; a
gather-and-broadcast root logs both its gather and its broadcast).

An API refit's ``events_dir`` (``Refitter(events_dir=...)``: ``events/rank-N.jsonl``, or ``rank-N.jsonl``
in the directory itself, and no summary.json) reads as a run too: its summary is synthesised from the
events (``"api": true``; per transport ``refit_s`` all/median/p90 of its refits, ``iterations``,
``verified`` when every commit event committed), each step's transport from its ``decide`` event.

``Refit``s of a source, one per (transport, step) and failed attempt:

* a run's timed refits carry summary.json's figure (``refit_s.all``, k-th timed step in step order);
* warm-up refits (``"warmup": true``) and API refits: the slowest rank's span, last end - first start of
  its refit phases (``round/*``, ``bucket/*``, ``verify``, ``verify/full``, ``commit``);
* a failed attempt (an ``attempt`` event with an error, or a run's whose ``outcome`` is not ``committed``): ``ok`` False, the longest failed attempt event
  (or the span of the step's refit phases when the attempt event has no duration).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError
from reshardctl.errors import InputError
from reshardctl.layout.layout_file import MAX_WORLD
from reshardctl.runs.records import event_logs, events_dir, read_events_tolerant, read_summary

TRANSFER_PHASES = ("round/transfer", "bucket/gather", "bucket/broadcast")


@dataclass
class Segment:
    rank: int
    side: str
    transport: str
    phase: str
    step: int | None
    start: float  # seconds since the run's first event
    duration: float
    error: str | None = None
    bytes: int = 0
    warmup: bool = False  # the event of a warm-up (untimed) refit: ``"warmup": true``
    attempt: int | None = None  # ``attempt`` events: which try of the step (0 first)


# ---- the report's series over time (contract between the data layer and plots.py) ----

@dataclass(frozen=True)
class Refit:
    """One refit of one transport, as its slowest rank saw it: a run's timed or warm-up iteration, or one
    ``Refitter.refit`` step of an API events directory."""
    source: str  # the run directory's (or API events directory's) label
    transport: str
    step: int
    start_unix: float  # the earliest start of the refit's phases over all ranks
    seconds: float  # the refit's latency: the slowest rank (for a run, summary.json's figure for the step)
    warmup: bool = False
    ok: bool = True  # False: the refit raised (a failed attempt that was not committed)


@dataclass(frozen=True)
class Expectation:
    """What the plan predicted for a transport, and its physical lower bound, over the span of one source's
    refits of it (``start_unix`` .. ``end_unix``)."""
    source: str
    transport: str
    predicted_s: float | None
    lower_bound_s: float | None
    start_unix: float
    end_unix: float


@dataclass(frozen=True)
class LedgerMark:
    """One runbook decision from the site ledger, placed on the time axis."""
    time_unix: float
    action: str  # promote | rollback
    verdict: str  # promoted | forced | refused | rolled_back | verify_failed
    transport: str  # the transport the entry names (promote: the candidate; rollback: gather_broadcast)
    label: str  # what the plot prints: "promoted reshard", "promote refused", "rollback (verified)"
    changes_active: bool


@dataclass
class History:
    """One panel of the latency-over-time plot: one site and model."""
    site: str | None
    model: str
    budget_s: float | None
    refits: list[Refit] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    marks: list[LedgerMark] = field(default_factory=list)


@dataclass
class RunData:
    run_dir: Path
    summary: dict[str, Any]
    segments: list[Segment] = field(default_factory=list)
    bad_event_lines: int = 0
    t0: float = 0.0  # unix time of the run's first event (Segment.start is relative to it)
    refits: list[Refit] = field(default_factory=list)  # every refit of the run, in time order

    @property
    def inputs(self) -> dict[str, Any]:
        return self.summary.get("inputs") or {}

    @property
    def transports(self) -> dict[str, dict]:
        return self.summary.get("transports") or {}

    @property
    def label(self) -> str:
        if self.api and self.run_dir.name == "events":  # an events_dir given as its events/ directory
            return self.run_dir.parent.name
        return self.run_dir.name

    @property
    def api(self) -> bool:
        """An API refit's events directory (its summary synthesised from the events)."""
        return self.summary.get("api") is True

    def bytes_per_rank(self) -> dict[str, dict[int, float]]:
        """transport -> rank -> median over refits of the bytes through the rank's transfer phases."""
        per: dict[tuple[str, int, int | None], int] = defaultdict(int)
        for s in self.segments:
            if s.phase in TRANSFER_PHASES:
                per[(s.transport, s.rank, s.step)] += s.bytes
        out: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        for (t, rank, _), n in per.items():
            out[t][rank].append(n)
        return {t: {r: float(statistics.median(v)) for r, v in sorted(ranks.items())} for t, ranks in out.items()}

    def ranks(self) -> list[tuple[int, str]]:
        return sorted({(s.rank, s.side) for s in self.segments})


def _finite(v: Any, lo: float = 0.0) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo


def _int(v: Any, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def _usable(d: Any) -> bool:
    """An event the report can place: a start time, a rank, and (when present) a duration, bytes and step
    of the right kind."""
    return (isinstance(d, dict) and _finite(d.get("start"), -math.inf) and _int(d.get("rank"), MAX_WORLD)
            and (d.get("duration_s") is None or _finite(d["duration_s"]))
            and (d.get("bytes") is None or _int(d["bytes"], 1 << 62))
            and (d.get("step") is None or _int(d["step"], 1 << 62)))


def _read_events(run_dir: Path, logs: list[Path]) -> tuple[list[dict], int]:
    rows, bad = [], 0
    for f in logs:
        try:
            events, skipped = read_events_tolerant(f)
        except LoadError as exc:
            raise InputError(f"report {run_dir}: {f.name}: cannot be read: {exc}") from None
        bad += skipped  # a rank killed mid-line: the report says how many lines it skipped
        for d in events:
            if _usable(d):
                rows.append(d)
            else:
                bad += 1
    return rows, bad


def _step_transports(rows: list[dict]) -> dict[tuple[int, int], str]:
    """(rank, step) -> the transport its ``decide`` event names (an API refit's events name no plan)."""
    return {(r["rank"], r["step"]): str(r["transport"]) for r in rows
            if r.get("phase") == "decide" and isinstance(r.get("step"), int) and isinstance(r.get("transport"), str)}


def _error(r: dict) -> str | None:
    """The error type of an event: ``error_type``, or a run's ``attempt`` whose ``outcome`` is not
    ``committed`` (``VerificationError: refit of step 2 not committed; ...``)."""
    if r.get("error_type"):
        return str(r["error_type"])
    outcome = r.get("outcome")
    if r.get("phase") == "attempt" and isinstance(outcome, str) and outcome != "committed":
        return outcome.split(":", 1)[0] or "failed"
    return None


def _segments(rows: list[dict], t0: float, only: str) -> list[Segment]:
    decided = _step_transports(rows)
    out = []
    for r in rows:
        step = r.get("step") if isinstance(r.get("step"), int) else None
        transport = r.get("plan") or decided.get((r["rank"], step)) or only
        attempt = r.get("attempt")
        out.append(Segment(rank=r["rank"], side=str(r.get("side", "")), transport=str(transport),
                           phase=str(r.get("phase", "")), step=step, start=float(r["start"]) - t0,
                           duration=float(r.get("duration_s") or 0.0), error=_error(r),
                           bytes=int(r.get("bytes") or 0), warmup=r.get("warmup") is True,
                           attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None))
    return out


def is_refit_phase(phase: str) -> bool:
    return phase.startswith(("round/", "bucket/")) or phase in ("verify", "verify/full", "commit")


def _slowest_span(segs: list[Segment]) -> float:
    """The slowest rank's refit: per rank last end - first start of its segments; the maximum."""
    per: dict[int, list[Segment]] = defaultdict(list)
    for s in segs:
        per[s.rank].append(s)
    return max((max(s.start + s.duration for s in v) - min(s.start for s in v) for v in per.values()), default=0.0)


def derive_refits(data: RunData, timed: dict[str, list[float]] | None) -> list[Refit]:
    """The refits of one source, in time order (module docstring). ``timed``: transport -> summary.json's
    per-iteration ``refit_s.all`` (None: an API events directory, every refit measured from its events)."""
    groups: dict[tuple[str, int], list[Segment]] = defaultdict(list)
    for s in data.segments:
        if s.step is not None and (is_refit_phase(s.phase) or s.phase == "attempt"):
            groups[(s.transport, s.step)].append(s)
    out: list[Refit] = []
    ok_steps: dict[str, list[int]] = defaultdict(list)
    for (transport, step), segs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        phases = [s for s in segs if s.phase != "attempt"]
        attempts = [s for s in segs if s.phase == "attempt"]
        warmup = any(s.warmup for s in segs)
        failed = [a for a in attempts if a.error]
        for n in sorted({a.attempt for a in failed}, key=lambda a: -1 if a is None else a):
            mine = [a for a in failed if a.attempt == n]
            secs = max(a.duration for a in mine) or _slowest_span([p for p in phases if p.start <= max(
                a.start for a in mine)] or phases)
            out.append(Refit(data.label, transport, step, data.t0 + min(a.start for a in mine), secs, warmup, ok=False))
        succeeded = any(not a.error for a in attempts) if attempts else bool(phases) and not any(p.error for p in phases)
        if not succeeded or not phases:
            continue
        if not warmup:
            ok_steps[transport].append(step)
        out.append(Refit(data.label, transport, step, data.t0 + min(p.start for p in phases), _slowest_span(phases),
                         warmup))
    if timed is not None:  # a run's timed refits: summary.json's figure of the k-th timed step
        figure = {(t, step): v for t, steps in ok_steps.items() for step, v in zip(steps, timed.get(t) or [])}
        out = [dataclasses.replace(r, seconds=figure[(r.transport, r.step)])
               if r.ok and not r.warmup and (r.transport, r.step) in figure else r for r in out]
    return sorted(out, key=lambda r: (r.start_unix, r.transport, r.step))


def _pct(values: list[float], q: float) -> float | None:
    """As runs/summary.py: the nearest-rank value at ``q`` of the sorted values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _api_summary(data: RunData, rows: list[dict]) -> dict[str, Any]:
    """What summary.json would say of an API events directory, as far as the events tell."""
    transports: dict[str, Any] = {}
    for t in sorted({r.transport for r in data.refits}):
        mine = sorted((r for r in data.refits if r.transport == t and r.ok and not r.warmup), key=lambda r: r.step)
        vals = [r.seconds for r in mine]
        commits = [s for s in data.segments if s.transport == t and s.phase == "commit"]
        committed = [r.get("committed") for r in rows if r.get("phase") == "commit"]
        transports[t] = {"refit_s": {"all": vals, "median": statistics.median(vals) if vals else None,
                                     "p90": _pct(vals, 0.9)},
                         "iterations": len(vals),
                         "verified": bool(commits) and all(c is True for c in committed),
                         "failures": []}
    sites = {e["site"] for r in rows if isinstance(e := r.get("ledger_entry"), dict) and isinstance(e.get("site"), str)}
    fingerprints = sorted({str(r["fingerprint"]) for r in rows if r.get("fingerprint")})
    failed = [r for r in data.refits if not r.ok]
    return {"api": True, "command": "API refits (Refitter events_dir)",
            "inputs": {"site": next(iter(sites)) if len(sites) == 1 else None, "model": None,
                       "fingerprints": fingerprints},
            "iterations": max((s["iterations"] for s in transports.values()), default=0), "warmup": 0,
            "ok": not failed, "transports": transports}


def load_run_data(run_dir: str | Path) -> RunData:
    """A run directory (summary.json and events/), or an API refit's events directory (no summary.json)."""
    path = Path(run_dir)
    api = path.is_dir() and not os.path.lexists(path / "summary.json") and bool(
        event_logs(events_dir(path)) or event_logs(path))
    if api:
        logs = event_logs(events_dir(path)) or event_logs(path)
        data = RunData(path.resolve(), {"api": True})  # the full summary once the refits are derived
    else:
        rec = read_summary(run_dir, flag="report")  # no such directory, no summary.json: the error says so
        logs = event_logs(events_dir(rec.run_dir))
        data = RunData(rec.run_dir, rec.summary)
    rows, data.bad_event_lines = _read_events(data.run_dir, logs)
    if rows:
        data.t0 = min(r["start"] for r in rows)
        only = next(iter(data.transports)) if len(data.transports) == 1 else "unknown"  # run: events name no plan
        data.segments = _segments(rows, data.t0, only)
    if api:
        data.refits = derive_refits(data, None)
        data.summary = _api_summary(data, rows)
    else:
        data.refits = derive_refits(data, {t: list((s.get("refit_s") or {}).get("all") or [])
                                           for t, s in data.transports.items()})
    return data


def expectations(run: RunData) -> list[Expectation]:
    """Per transport with a prediction or a lower bound in summary.json: over the span of its refits."""
    out = []
    for t, s in run.transports.items():
        pred, lb = s.get("predicted_s"), s.get("lower_bound_s")
        mine = [r for r in run.refits if r.transport == t]
        if not mine or not (_finite(pred) or _finite(lb)):
            continue
        out.append(Expectation(run.label, t, pred if _finite(pred) else None, lb if _finite(lb) else None,
                               min(r.start_unix for r in mine), max(r.start_unix + r.seconds for r in mine)))
    return out


def load_runs(run_dirs: list[str]) -> list[RunData]:
    if not run_dirs:
        raise InputError("report: give at least one run directory")
    return [load_run_data(d) for d in run_dirs]
