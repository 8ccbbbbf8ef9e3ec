"""The site ledger: the active refit transport of a site and the history of every change and measured run.

One file per site, ``<state_dir>/<site>.ledger.jsonl``, one JSON object per line, only ever appended:

* ``state_dir`` is the profile's top-level ``state_dir`` key (``~`` and ``$VARS`` expanded; a relative
  path is relative to the profile file's directory), else the per-user state directory
  ``$XDG_STATE_HOME/reshardctl`` (``~/.local/state/reshardctl`` when ``XDG_STATE_HOME`` is unset).
* Appends happen under an exclusive ``fcntl.flock`` on the ledger file itself: the reader-decider-writer
  sequence of ``promote`` and ``rollback`` (read the history, decide, append) is one critical section,
  so racing commands serialise and no entry is lost. All lines of one step go out in one ``write`` and
  are fsynced; a write that fails part-way is truncated back to the previous end under the lock.
* A line that is not a JSON object, lacks a field, or was written by a newer ledger version is a
  ``LedgerError`` (exit 2) naming the file and the line. The file is never rewritten or "repaired".
"""

from __future__ import annotations

import fcntl
import getpass
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, loads_json, open_regular, read_fd
from reshardctl.errors import LedgerError, OutputError
from reshardctl.site.spec import SiteProfile

LEDGER_VERSION = 1
MAX_LEDGER_BYTES = 64 << 20  # read whole under the lock; ~30,000 entries
ACTIONS = ("measure", "promote", "rollback")
# field -> accepted JSON types (None: null allowed)
FIELDS: dict[str, tuple] = {
    "v": (int,),
    "time": (str,),
    "user": (str,),
    "host": (str,),
    "site": (str,),
    "action": (str,),
    "transport": (str,),
    "run_dir": (str, type(None)),
    "plan_fingerprint": (str, type(None)),
    "median_s": (float, int, type(None)),
    "p90_s": (float, int, type(None)),
    "budget_s": (float, int, type(None)),
    "verdict": (str,),
    "reason": (str, type(None)),
}
_OPT_STR = (str, type(None))
# the ``details`` keys that are read back (promote compares the last promotion's model and layouts, rollback
# --verify replays its inputs, status shows the last rollback's verification) -> accepted JSON types
DETAIL_FIELDS: dict[str, tuple] = {
    "model": _OPT_STR, "train": _OPT_STR, "infer": _OPT_STR, "active_before": _OPT_STR,
    "verify": (bool, type(None)), "verified": (bool, type(None)), "forced": (bool, type(None)),
    "inputs": (dict, type(None)),
}
# ``details.inputs``: the plan inputs of a run (request/request.py RefitRequest.plan_inputs; older ledgers
# lack mtp) -> accepted JSON types
INPUT_FIELDS: dict[str, tuple] = {
    "model": _OPT_STR, "layers": (int, type(None)), "mtp": (bool, type(None)), "train": _OPT_STR, "infer": _OPT_STR,
    "train_style": _OPT_STR, "infer_style": _OPT_STR, "train_layout": _OPT_STR, "infer_layout": _OPT_STR,
    "bucket_mb": (int, float, type(None)), "relay": _OPT_STR,
}


@dataclass(frozen=True)
class Entry:
    """One ledger line. ``details`` holds what a step adds (conditions, inputs, active before/after)."""

    site: str
    action: str  # measure | promote | rollback
    transport: str
    verdict: str  # measure: within_budget | over_budget | not_verified; promote: promoted | forced | refused;
    #               rollback: rolled_back | verify_failed
    run_dir: str | None = None
    plan_fingerprint: str | None = None
    median_s: float | None = None
    p90_s: float | None = None
    budget_s: float | None = None
    reason: str | None = None
    time: str = ""
    user: str = ""
    host: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def changes_active(self) -> bool:
        return (self.action == "promote" and self.verdict in ("promoted", "forced")) or (
            self.action == "rollback" and self.verdict == "rolled_back")

    def to_json(self) -> dict[str, Any]:
        d = {"v": LEDGER_VERSION, "time": self.time, "user": self.user, "host": self.host, "site": self.site,
             "action": self.action, "transport": self.transport, "run_dir": self.run_dir,
             "plan_fingerprint": self.plan_fingerprint, "median_s": self.median_s, "p90_s": self.p90_s,
             "budget_s": self.budget_s, "verdict": self.verdict, "reason": self.reason}
        if self.details:
            d["details"] = self.details
        return d


def stamped(entry_kwargs: dict[str, Any]) -> Entry:
    """An entry with the time (UTC, ISO 8601), user and host of this process filled in."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return Entry(time=stamp, user=user, host=socket.gethostname(), **entry_kwargs)


def default_state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "reshardctl"


def state_dir(profile: SiteProfile) -> Path:
    if not profile.state_dir:
        return default_state_dir()
    path = Path(os.path.expandvars(os.path.expanduser(profile.state_dir)))
    if not path.is_absolute() and not profile.source.startswith("builtin:"):
        path = Path(profile.source).resolve().parent / path
    return path


def ledger_path(profile: SiteProfile) -> Path:
    return state_dir(profile) / f"{profile.name}.ledger.jsonl"


def _entry(path: Path, lineno: int, text: str) -> Entry:
    where = f"ledger {path}, line {lineno}"
    try:
        d = loads_json(text)
    except LoadError as exc:
        raise LedgerError(f"{where}: {exc}",
                          hint="reshardctl never rewrites a ledger: move the file aside or fix the line by hand") from None
    if not isinstance(d, dict):
        raise LedgerError(f"{where}: expected a JSON object, got {type(d).__name__}")
    v = d.get("v")
    if not isinstance(v, int) or isinstance(v, bool):
        raise LedgerError(f"{where}: `v` (the ledger version) is missing or not an integer: {v!r}")
    if v > LEDGER_VERSION:
        raise LedgerError(f"{where}: written by a newer reshardctl (ledger version {v}; this one reads up to "
                          f"{LEDGER_VERSION})", hint="upgrade reshardctl; the ledger is left as it is")
    for key, types in FIELDS.items():
        if key not in d:
            raise LedgerError(f"{where}: field `{key}` is missing")
        if not isinstance(d[key], types) or isinstance(d[key], bool):
            raise LedgerError(f"{where}: field `{key}` has the wrong type: {d[key]!r}")
    if d["action"] not in ACTIONS:
        raise LedgerError(f"{where}: `action` {d['action']!r} is not one of {', '.join(ACTIONS)}")
    kw = {k: d[k] for k in FIELDS if k != "v"}
    for k in ("median_s", "p90_s", "budget_s"):
        if kw[k] is not None and not (math.isfinite(kw[k]) and kw[k] >= 0):
            raise LedgerError(f"{where}: field `{k}` must be a finite number of seconds >= 0, got {kw[k]!r}")
        kw[k] = None if kw[k] is None else float(kw[k])
    return Entry(details=_details(where, d.get("details", {})), **kw)


def _typed(where: str, key: str, value: Any, types: tuple) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join("null" if t is type(None) else {"str": "a string", "bool": "true/false", "int": "an integer",
                            "float": "a number", "dict": "a JSON object"}[t.__name__] for t in types)
        raise LedgerError(f"{where}: `{key}` must be {names}, got {str(value)[:80]!r}",
                          hint="reshardctl never rewrites a ledger: move the file aside or fix the line by hand")
    if isinstance(value, float) and not math.isfinite(value):
        raise LedgerError(f"{where}: `{key}` must be a finite number, got {value!r}")


def _details(where: str, details: Any) -> dict[str, Any]:
    _typed(where, "details", details, (dict,))
    for key, types in DETAIL_FIELDS.items():
        if key in details:
            _typed(where, f"details.{key}", details[key], types)
    inputs = details.get("inputs")
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(INPUT_FIELDS))
        if unknown:
            raise LedgerError(f"{where}: `details.inputs` has unknown keys {', '.join(map(repr, unknown))[:200]} "
                              f"(known: {', '.join(INPUT_FIELDS)})",
                              hint="reshardctl never rewrites a ledger: move the file aside or fix the line by hand")
        for key, value in inputs.items():
            _typed(where, f"details.inputs.{key}", value, INPUT_FIELDS[key])
    return details


def parse_ledger(path: Path, data: bytes) -> list[Entry]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise LedgerError(f"ledger {path}, line {line}: not UTF-8 text") from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] != "":
        raise LedgerError(f"ledger {path}, line {len(lines)}: incomplete (no newline at the end: an interrupted "
                          "write by another program?)", hint="reshardctl never rewrites a ledger: move the file "
                          "aside or fix the line by hand")
    return [_entry(path, i, line) for i, line in enumerate(lines[:-1], start=1)]


def _read_locked(path: Path, fd: int) -> bytes:
    try:
        return read_fd(fd, MAX_LEDGER_BYTES)
    except LoadError as exc:
        raise LedgerError(f"ledger {path}: cannot be read: {exc}") from None


def read_ledger(path: Path) -> list[Entry]:
    """Every entry, oldest first ([] when the ledger does not exist yet). Reads under a shared lock;
    anything but a regular file (a FIFO, a device) is refused without reading it."""
    try:
        fd = open_regular(path)
    except LoadError as exc:
        if exc.missing:
            return []
        raise LedgerError(f"ledger {path}: cannot be read: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        data = _read_locked(path, fd)
    finally:
        os.close(fd)
    return parse_ledger(path, data)


class Transaction:
    """The ledger as read under the exclusive lock, and the entries to append when the block ends."""

    def __init__(self, path: Path, entries: list[Entry]):
        self.path = path
        self.entries = entries
        self.pending: list[Entry] = []

    def append(self, entry: Entry) -> Entry:
        self.pending.append(entry)
        return entry


@contextmanager
def transaction(path: Path) -> Iterator[Transaction]:
    """Lock the ledger (creating it and its directory), read it, yield; append ``pending`` when the block
    succeeds (one write, fsynced). Nothing is appended when the block raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_regular(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except LoadError as exc:
        raise LedgerError(f"ledger {path}: cannot be opened: {exc}") from None
    except OSError as exc:
        raise OutputError(f"ledger {path}: cannot be created or opened: {exc.strerror or exc}",
                          hint="set state_dir in the site profile to a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        data = _read_locked(path, fd)
        txn = Transaction(path, parse_ledger(path, data))
        yield txn
        if txn.pending:
            blob = "".join(json.dumps(e.to_json(), sort_keys=False, allow_nan=False) + "\n"
                           for e in txn.pending).encode()
            try:
                written = os.write(fd, blob)
                if written != len(blob):
                    raise OSError(0, f"short write ({written} of {len(blob)} bytes)")
                os.fsync(fd)
            except OSError as exc:
                os.ftruncate(fd, size)  # our own partial line, never an older entry
                raise OutputError(f"ledger {path}: the append failed: {exc.strerror or exc}; nothing was recorded") \
                    from None
            txn.entries.extend(txn.pending)
    finally:
        os.close(fd)  # releases the lock


# --- the state the history implies -------------------------------------------------------------------------


def active(entries: list[Entry], profile: SiteProfile) -> tuple[str, Entry | None]:
    """The active transport and the entry that made it so (None: no change recorded; the profile's
    ``refit.transport`` is the active one)."""
    for e in reversed(entries):
        if e.changes_active:
            return e.transport, e
    return profile.refit.transport, None


def last(entries: list[Entry], action: str, verdicts: tuple[str, ...] | None = None) -> Entry | None:
    for e in reversed(entries):
        if e.action == action and (verdicts is None or e.verdict in verdicts):
            return e
    return None


def latest_measured(entries: list[Entry]) -> dict[str, Entry]:
    """The latest ``measure`` entry of every transport."""
    out: dict[str, Entry] = {}
    for e in entries:
        if e.action == "measure":
            out[e.transport] = e
    return out
