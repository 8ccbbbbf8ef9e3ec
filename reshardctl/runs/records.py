"""The records of a run directory, typed, with one owner: their paths, writers and readers.

```
<run_dir>/session.json        SessionRecord  what the summary needs besides the ranks' reports (written
                                             before any rank starts; `collect` summarises from it)
<run_dir>/summary.json        SummaryRecord  the measured figures per transport, the failures, the request
<run_dir>/events/rank-N.jsonl one event (JSON object) per line per rank, written by runtime/events.py
```
(``run.json`` and the directory itself: ``runs/rundir.py``; ``record.json``: ``runs/record.py``.)

The JSON shapes are unchanged by the typed wrappers: ``SessionRecord`` and ``SummaryRecord`` hold the
object as written and give typed access to the keys their readers use; the ``request`` key (the refit
request, ``request/request.py``) is carried as an opaque mapping. Every read is bounded and refuses
anything but a regular file before reading it (a FIFO, ``/dev/zero``, a symlink to either: opened
non-blocking and ``fstat``-ed, ``bounded_load``): a tampered, truncated or newer record is an
``InputError`` (exit 2) naming the file and the key, never a traceback or a hang. Event lines have one
parser (``parse_event``); the progress counters and the reports read events through it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, loads_json, open_regular, read_fd, read_text
from reshardctl.errors import InputError
from reshardctl.layout.layout_file import MAX_WORLD
from reshardctl.runs.rundir import write_json

SESSION_JSON = "session.json"
SUMMARY_JSON = "summary.json"
EVENTS_DIR = "events"
SESSION_FORMAT = "reshardctl-session/1"
MAX_SESSION_BYTES = 64 << 20  # session.json
MAX_SUMMARY_BYTES = 64 << 20  # summary.json: per-rank records of a few thousand ranks
MAX_EVENTS_BYTES = 256 << 20  # one rank's events/rank-N.jsonl, as any reader takes it
EDITED = "it is written by `reshardctl run`/`bench`: was it edited, or written by a newer reshardctl?"


def events_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / EVENTS_DIR


def events_path(run_dir: str | os.PathLike, rank: int) -> Path:
    return events_dir(run_dir) / f"rank-{rank}.jsonl"


def read_json_object(path: Path, max_bytes: int, *, missing: str | None = None) -> dict | None:
    """The JSON object in ``path``, read bounded (a regular file of at most ``max_bytes``, refused before
    it is read otherwise). A missing file is None, or ``InputError(missing)`` when ``missing`` is given;
    anything unreadable or not a JSON object is an ``InputError`` naming the file."""
    try:
        data = loads_json(read_text(path, max_bytes))
    except LoadError as exc:
        if exc.missing and missing is None:
            return None
        if exc.missing:
            raise InputError(missing) from None
        raise InputError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _check_format(path: Path, data: Mapping, known: tuple[str | None, ...]) -> None:
    fmt = data.get("format")
    if fmt not in known:
        raise InputError(f"{path}: `format` is {str(fmt)[:80]!r}; this reshardctl reads "
                         f"{' or '.join(repr(k) for k in known if k) or 'no format key'}",
                         hint="written by a newer reshardctl? read it with that version")


def _check_request(path: Path, data: Mapping) -> None:
    req = data.get("request")
    if req is not None and not isinstance(req, dict):
        raise InputError(f"{path}: `request` must be a JSON object (the refit request) or null, "
                         f"got {str(req)[:80]!r}", hint=EDITED)


# -- session.json -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionRecord:
    """``session.json``: everything ``summary.json`` needs besides the ranks' reports (``context``, the
    object as written: runs/session.session_context)."""

    path: Path
    context: dict[str, Any]

    @property
    def world(self) -> int:
        return self.context["world"]

    @property
    def transports(self) -> list[str]:
        return list(self.context["transports"])

    @property
    def request(self) -> Mapping | None:
        return self.context.get("request")

    @property
    def started_by(self) -> dict:
        return self.context.get("started_by") or {}

    @property
    def started_at(self) -> float | None:
        return self.context.get("started_at")


def write_session(run_dir: Path, context: Mapping) -> Path:
    return write_json(Path(run_dir) / SESSION_JSON, dict(context))


def read_session(run_dir: str | os.PathLike) -> SessionRecord:
    """``session.json`` of a run directory, bounded (``MAX_SESSION_BYTES``), with the keys collecting
    reads checked: ``format``, ``world`` (1..MAX_WORLD ranks: reports are read per rank),
    ``transports``, ``request`` (an object or null), ``started_by`` (an object or null)."""
    run_dir = Path(run_dir)
    path = run_dir / SESSION_JSON
    ctx = read_json_object(path, MAX_SESSION_BYTES, missing=f"{run_dir}: not a reshardctl run directory "
                                                            f"(no {SESSION_JSON})")
    _check_format(path, ctx, (SESSION_FORMAT,))
    world = ctx.get("world")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= MAX_WORLD:
        raise InputError(f"{path}: `world` must be a number of ranks from 1 to {MAX_WORLD:,} (MAX_WORLD), "
                         f"got {str(world)[:40]}")
    names = ctx.get("transports")
    if not isinstance(names, (list, dict)) or not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"{path}: `transports` must name the run's transports, got {str(names)[:80]!r}")
    if isinstance(names, dict) and not all(isinstance(c, dict) for c in names.values()):
        raise InputError(f"{path}: `transports` must map each transport to a JSON object, got {str(names)[:80]!r}")
    if not isinstance(ctx.get("started_by") or {}, dict):
        raise InputError(f"{path}: `started_by` must be a JSON object, got {str(ctx.get('started_by'))[:80]!r}")
    _check_request(path, ctx)
    return SessionRecord(path, ctx)


# -- summary.json -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRecord:
    """A finished run directory as evidence: ``summary`` is ``summary.json`` as written (fields read
    with ``.get``: sessions from newer code may add fields, older ones may lack some), checked by
    ``check_summary`` for the keys promote, rollback and the report read."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def inputs(self) -> dict[str, Any]:
        return self.summary.get("inputs") or {}

    @property
    def request(self) -> Mapping | None:
        return self.summary.get("request")

    @property
    def site(self) -> str | None:
        return self.inputs.get("site")

    @property
    def model(self) -> str | None:
        return self.inputs.get("model")

    @property
    def layouts(self) -> tuple[str | None, str | None]:
        return self.inputs.get("train"), self.inputs.get("infer")

    @property
    def transports(self) -> dict[str, dict]:
        return self.summary.get("transports") or {}

    def figure(self, transport: str, key: str = "median") -> float | None:
        s = self.transports.get(transport) or {}
        v = (s.get("refit_s") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else None

    def verified(self, transport: str) -> bool:
        s = self.transports.get(transport) or {}
        return bool(s.get("verified")) and not s.get("failures") and (s.get("iterations") or 0) > 0

    def fingerprint(self, transport: str) -> str | None:
        return (self.transports.get(transport) or {}).get("fingerprint")

    @property
    def transport_source(self) -> dict[str, Any] | None:
        """Who chose the run's transport: ``{"transport", "decided_by": "flag" | "ledger" | "profile",
        "ledger_entry": {"line", "action", "time", "user", "transport"} | None, "note"}`` (None: a run of
        older code)."""
        return self.summary.get("transport_source")


_SECONDS = "a finite number of seconds >= 0"
# summary.json keys that promote, rollback and report read -> what they must hold ("seconds": a finite
# number >= 0, "count": an integer >= 0, else JSON types); None is always allowed (an older summary)
SUMMARY_KEYS: dict[str, Any] = {
    "command": (str,), "iterations": "count", "warmup": "count", "ok": (bool,), "interrupted": (bool,),
    "error": (str,), "inputs": (dict,), "transports": (dict,), "slurm": (dict,), "request": (dict,),
    "transport_source": (dict,),
}
INPUT_KEYS: dict[str, Any] = {k: (str,) for k in ("site", "model", "model_source", "train", "infer")}
TRANSPORT_KEYS: dict[str, Any] = {
    "fingerprint": (str,), "iterations": "count", "verified": (bool,), "failures": (list,), "refit_s": (dict,),
    "predicted_s": "seconds", "lower_bound_s": "seconds",
}
FIGURE_KEYS: dict[str, Any] = {"median": "seconds", "p90": "seconds", "min": "seconds", "all": (list,)}


def _kind_problem(value: Any, want: Any) -> str | None:
    """Why ``value`` is not ``want`` (a tuple of JSON types, "seconds" or "count"), or None when it is."""
    if value is None:
        return None
    if want == "seconds":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        return None if ok else _SECONDS
    if want == "count":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "an integer >= 0"
    if isinstance(value, want) and (bool in want or not isinstance(value, bool)):
        return None
    return " or ".join({"str": "a string", "bool": "true/false", "dict": "a JSON object", "list": "a list"}[t.__name__]
                       for t in want)


def _check(where: str, obj: dict, keys: dict[str, Any], prefix: str) -> None:
    for key, want in keys.items():
        why = _kind_problem(obj.get(key), want)
        if why is not None:
            raise InputError(f"{where}: `{prefix}{key}` must be {why} (or null), got {str(obj.get(key))[:80]!r}",
                             hint="summary.json is written by `reshardctl run`/`bench`: was it edited?")


def check_summary(summary: Any, where: str) -> None:
    """Refuse (``InputError`` naming the key) a summary whose fields the runbook and the report read have
    the wrong type, or a time or count that is negative, NaN or infinite."""
    if not isinstance(summary, dict) or not isinstance(summary.get("transports"), dict):
        raise InputError(f"{where}: has no `transports` mapping")
    _check(where, summary, SUMMARY_KEYS, "")
    _check(where, summary.get("inputs") or {}, INPUT_KEYS, "inputs.")
    for name, s in summary["transports"].items():
        if not isinstance(s, dict):
            raise InputError(f"{where}: `transports.{name}` must be a JSON object, got {str(s)[:80]!r}")
        _check(where, s, TRANSPORT_KEYS, f"transports.{name}.")
        fig = s.get("refit_s") or {}
        _check(where, fig, FIGURE_KEYS, f"transports.{name}.refit_s.")
        for i, v in enumerate(fig.get("all") or []):
            if _kind_problem(v, "seconds"):
                raise InputError(f"{where}: `transports.{name}.refit_s.all[{i}]` must be {_SECONDS}, got {v!r}")
        for i, f in enumerate(s.get("failures") or []):
            if not isinstance(f, dict):
                raise InputError(f"{where}: `transports.{name}.failures[{i}]` must be a JSON object, got {str(f)[:80]!r}")


def write_summary_json(run_dir: Path, summary: Mapping) -> Path:
    return write_json(Path(run_dir) / SUMMARY_JSON, dict(summary))


def read_summary(run_dir: str | os.PathLike, flag: str = "--run") -> SummaryRecord:
    """``summary.json`` of ``run_dir`` (``flag``: how the command names it in errors), bounded
    (``MAX_SUMMARY_BYTES``) and checked (``check_summary``; a ``format`` key, which no reshardctl
    writes yet, is a newer summary: refused)."""
    path = Path(run_dir)
    f = path / SUMMARY_JSON
    if not path.is_dir():
        raise InputError(f"{flag} {run_dir}: no such run directory")
    try:
        summary = loads_json(read_text(f, MAX_SUMMARY_BYTES))
    except LoadError as exc:
        if exc.missing:
            raise InputError(f"{flag} {run_dir}: no summary.json (not a run directory of `reshardctl run`/`bench`, "
                             "or the run was interrupted before it was summarised)") from None
        raise InputError(f"{flag} {run_dir}: summary.json cannot be read: {exc}") from None
    where = f"{flag} {run_dir}: summary.json"
    if isinstance(summary, dict) and summary.get("format") is not None:
        _check_format(Path(where), summary, (None,))
    check_summary(summary, where)
    return SummaryRecord(path.resolve(), summary)


# -- events/rank-N.jsonl ------------------------------------------------------------------------------


def parse_event(line: str) -> dict[str, Any] | None:
    """One line of an event log as the event (a JSON object, bounded: ``loads_json``); None for a line
    that is not one (a rank killed mid-line, a tampered line)."""
    if not line.strip():
        return None
    try:
        ev = loads_json(line)
    except LoadError:
        return None
    return ev if isinstance(ev, dict) else None


def event_logs(events: str | os.PathLike) -> list[Path]:
    """The ``rank-*.jsonl`` files under the events directory ``events``, in name order."""
    return sorted(Path(events).glob("rank-*.jsonl"))


def read_events(path: str | os.PathLike, max_bytes: int = MAX_EVENTS_BYTES) -> list[dict[str, Any]]:
    """The events of one log, strictly: ``LoadError`` (a ``ValueError``) for a missing file, for a FIFO,
    a device or a symlink to one (refused without reading it, never a hang), for a file over
    ``max_bytes`` and for a line that is not a bounded JSON object."""
    out = []
    for n, line in enumerate(read_text(path, max_bytes).splitlines(), 1):
        if not line.strip():
            continue
        ev = parse_event(line)
        if ev is None:
            raise LoadError(f"line {n} is not a JSON object")
        out.append(ev)
    return out


def read_events_tolerant(path: str | os.PathLike, max_bytes: int = MAX_EVENTS_BYTES) -> tuple[list[dict], int]:
    """The events of one log and the number of lines skipped (not an event: a rank killed mid-line);
    ``LoadError`` for a file that is missing, not regular or over ``max_bytes``."""
    events, bad = [], 0
    for line in read_text(path, max_bytes).splitlines():
        if not line.strip():
            continue
        ev = parse_event(line)
        if ev is None:
            bad += 1
        else:
            events.append(ev)
    return events, bad


def readable_events(events: str | os.PathLike, max_bytes: int = MAX_EVENTS_BYTES) -> Iterator[list[dict]]:
    """The events of each readable log under ``events`` (a log that is not a regular file or is over
    ``max_bytes`` is skipped: ``unreadable_logs`` names it for the summary; a bad line is skipped)."""
    for f in event_logs(events):
        try:
            yield read_events_tolerant(f, max_bytes)[0]
        except LoadError:
            continue


def run_events(run_dir: str | os.PathLike) -> list[dict]:
    """Every readable event of a run, log by log (``readable_events``)."""
    return [e for log in readable_events(events_dir(run_dir)) for e in log]


def last_event(run_dir: str | os.PathLike | None, rank: int) -> dict:
    """The rank's drill event if it has one, else its last event (where a rank without a report was);
    ``{}`` when it left no readable log."""
    if not run_dir:
        return {}
    try:
        ev = read_events_tolerant(events_path(run_dir, rank))[0]
    except LoadError:
        return {}
    drill = [e for e in ev if e.get("phase") == "drill"]
    return drill[-1] if drill else (ev[-1] if ev else {})


def commits_by_side(events: str | os.PathLike) -> dict[str, int]:
    """Commit events written so far under the events directory ``events``, per side (``{"train": n,
    "infer": m}``): a run's live progress."""
    out = {"train": 0, "infer": 0}
    for log in readable_events(events):
        for e in log:
            if e.get("phase") == "commit":
                out["infer" if e.get("side") == "infer" else "train"] += 1
    return out


def count_commits(events: str | os.PathLike) -> int:
    return sum(commits_by_side(events).values())


def ranks_with_phase(events: str | os.PathLike, phase: str) -> int:
    """How many logs under ``events`` hold an event of ``phase`` (``materialise``: set-up progress)."""
    return sum(any(e.get("phase") == phase for e in log) for log in readable_events(events))


def unreadable_logs(events: str | os.PathLike, max_bytes: int = MAX_EVENTS_BYTES) -> list[str]:
    """``<file>: <why> (skipped)`` for each ``rank-*.jsonl`` under ``events`` that readers skip: not a
    regular file (checked on an opened descriptor, non-blocking: never a hang) or over ``max_bytes``."""
    out = []
    for f in event_logs(events):
        try:
            fd = open_regular(f)
        except LoadError as exc:
            if not exc.missing:
                out.append(f"{f}: {exc} (skipped)")
            continue
        try:
            if os.fstat(fd).st_size > max_bytes:
                read_fd(fd, max_bytes)  # raises, with the sizes
        except LoadError as exc:
            out.append(f"{f}: {exc} (skipped)")
        finally:
            os.close(fd)
    return out
