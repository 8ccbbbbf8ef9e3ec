"""What a report needs from one run directory: summary.json and the ranks' events, both read through
``runs/records.py`` (bounded, checked; a line that is not an event is counted, not fatal).

``events/rank-N.jsonl`` gives the per-iteration phase timeline and the bytes through each rank's
transfer phases (a trainer rank logs what it sent, an inference rank what it received; a
gather-and-broadcast root logs both its gather and its broadcast).
"""

from __future__ import annotations

import math
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
# phases of one refit, in the order the timeline's legend shows them
REFIT_PHASES = ("materialise", "round/pack", "round/transfer", "round/unpack", "bucket/gather", "bucket/broadcast",
                "bucket/unpack", "verify", "verify/full", "commit")


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

    @property
    def inputs(self) -> dict[str, Any]:
        return self.summary.get("inputs") or {}

    @property
    def transports(self) -> dict[str, dict]:
        return self.summary.get("transports") or {}

    @property
    def label(self) -> str:
        return self.run_dir.name

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


def _read_events(run_dir: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    for f in event_logs(events_dir(run_dir)):
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


def load_run_data(run_dir: str | Path) -> RunData:
    rec = read_summary(run_dir, flag="report")
    rows, bad = _read_events(rec.run_dir)
    data = RunData(rec.run_dir, rec.summary, bad_event_lines=bad)
    if rows:
        t0 = min(r["start"] for r in rows)
        only = next(iter(data.transports)) if len(data.transports) == 1 else "unknown"  # run: events name no plan
        for r in rows:
            seg = Segment(rank=r["rank"], side=str(r.get("side", "")), transport=str(r.get("plan") or only),
                          phase=str(r.get("phase", "")), step=r.get("step") if isinstance(r.get("step"), int) else None,
                          start=float(r["start"]) - t0, duration=float(r.get("duration_s") or 0.0),
                          error=r.get("error_type"), bytes=int(r.get("bytes") or 0))
            data.segments.append(seg)
    return data


def load_runs(run_dirs: list[str]) -> list[RunData]:
    if not run_dirs:
        raise InputError("report: give at least one run directory")
    return [load_run_data(d) for d in run_dirs]
