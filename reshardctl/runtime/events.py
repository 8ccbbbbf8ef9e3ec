"""One JSON line per phase per rank: ``<run_dir>/events/rank-<N>.jsonl``.

    with events.phase("round/transfer", round=3, bytes=n, peers=[4, 5]):
        ...

records ``phase``, ``rank``, ``side``, ``start`` (unix time), ``duration_s``, the given fields and, when
the body raised, ``error_type`` and ``error`` (then re-raises). Spans measured by hand (an async
transfer posted in one place and waited in another) go through ``record``.

A log the disk refuses (full, read-only) never fails the refit it records: the first refused write is
kept in ``error`` (the file and why, which the rank's report carries), the log stops there and counts
the events it dropped (``dropped``).

The readers of these logs live with the run's other records (``runs/records.py``: ``parse_event``,
``read_events``).
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
