"""One JSON line per phase per rank: ``<run_dir>/events/rank-<N>.jsonl``.

    with events.phase("round/transfer", round=3, bytes=n, peers=[4, 5]):
        ...

records ``phase``, ``rank``, ``side``, ``start`` (unix time), ``duration_s``, the given fields and, when
the body raised, ``error_type`` and ``error`` (then re-raises). Spans measured by hand (an async
transfer posted in one place and waited in another) go through ``record``.

A log the disk refuses (full, read-only) never fails the refit it records: the first refused write is
kept in ``error`` (the file and why, which the rank's report carries), the log stops there and counts
the events it dropped (``dropped``).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


class EventLog:
    def __init__(self, run_dir: str | Path | None, rank: int, side: str, **common: Any):
        self.rank, self.side, self.common = rank, side, common
        self.path = None if run_dir is None else Path(run_dir) / "events" / f"rank-{rank}.jsonl"
        self._fh = None
        self.error: str | None = None  # the first write the disk refused: "<file>: <why>"
        self.dropped = 0  # events not written after it

    def _refused(self, exc: OSError) -> None:
        self.error = f"{self.path}: {exc.strerror or exc}"
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass

    def _write(self, rec: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self.error is not None:
            self.dropped += 1
            return
        try:
            if self._fh is None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # private to the user
                self._fh = open(fd, "a", buffering=1, encoding="utf-8")
            self._fh.write(json.dumps(rec, default=str, separators=(",", ":")) + "\n")
        except OSError as exc:
            self.dropped += 1
            self._refused(exc)

    def record(self, phase: str, start: float, duration_s: float, error: BaseException | None = None,
               **fields: Any) -> None:
        rec: dict[str, Any] = {
            "phase": phase, "rank": self.rank, "side": self.side,
            "start": round(start, 6), "duration_s": round(duration_s, 6),
        }
        rec.update(self.common)
        rec.update({k: v for k, v in fields.items() if v is not None})
        if error is not None:
            rec["error_type"] = type(error).__name__
            rec["error"] = str(error)
        self._write(rec)

    @contextmanager
    def phase(self, name: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Time the body; the yielded dict may be filled with more fields (bytes known only later)."""
        start, t0 = time.time(), time.perf_counter()
        extra: dict[str, Any] = {}
        try:
            yield extra
        except BaseException as exc:
            self.record(name, start, time.perf_counter() - t0, error=exc, **fields, **extra)
            raise
        self.record(name, start, time.perf_counter() - t0, **fields, **extra)

    def flush(self) -> None:
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                self._refused(exc)

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self._fh = None
                self._refused(exc)
            self._fh = None

    def problem(self) -> str | None:
        """``<file>: <why> (<n> events not written)`` when the disk refused this log, else None."""
        return None if self.error is None else f"{self.error} ({self.dropped} event(s) not written)"


MAX_EVENTS_BYTES = 256 << 20  # one rank's events/rank-N.jsonl, as any reader takes it


def read_events(path: str | Path, max_bytes: int = MAX_EVENTS_BYTES) -> list[dict[str, Any]]:
    """The events of one log, read through ``bounded_load`` (a regular file of at most ``max_bytes``; a
    FIFO, a device or a symlink to one is refused without reading it, never a hang). ``LoadError`` (a
    ``ValueError``) for such a file, for a line that is not bounded JSON, and for a missing file."""
    from reshardctl.bounded_load import loads_json, read_text

    return [loads_json(line) for line in read_text(path, max_bytes).splitlines() if line.strip()]


def event_texts(events_dir: str | Path, max_bytes: int = MAX_EVENTS_BYTES) -> Iterator[str]:
    """The text of each ``rank-*.jsonl`` under ``events_dir`` that is a readable regular file of at most
    ``max_bytes``; the others are skipped (``unreadable_logs`` names them for the summary)."""
    from reshardctl.bounded_load import LoadError, read_text

    for f in sorted(Path(events_dir).glob("rank-*.jsonl")):
        try:
            yield read_text(f, max_bytes)
        except LoadError:
            continue


def unreadable_logs(events_dir: str | Path, max_bytes: int = MAX_EVENTS_BYTES) -> list[str]:
    """``<file>: <why> (skipped)`` for each ``rank-*.jsonl`` under ``events_dir`` that readers skip: not a
    regular file (checked on an opened descriptor, non-blocking: never a hang) or over ``max_bytes``."""
    from reshardctl.bounded_load import LoadError, open_regular, read_fd

    out = []
    for f in sorted(Path(events_dir).glob("rank-*.jsonl")):
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
