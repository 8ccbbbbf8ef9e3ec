"""Phase timings that report device time on a GPU and host time on a CPU, resolved lazily.

On a GPU the host only enqueues work: a ``perf_counter`` span around a pack, a ``batch_isend_irecv``
or a broadcast measures the enqueue (microseconds), not the copy or the transfer. A ``Span`` records a
CUDA event (``enable_timing=True``) on a stream at the phase's start and another at its end; the
elapsed device time is read only later, once the end event completed (after a synchronisation the
refit does anyway: the verify phase, the vote), so timing adds no host sync to the data path.

GPU semantics (what a device span measures):

* ``start()`` enqueues the start event on ``stream``: it is timestamped when the stream REACHES it
  (after the work enqueued before it), not when the host called ``start()``.
* ``stop()`` enqueues the end event: timestamped when everything enqueued on ``stream`` between the
  two, and everything the stream was made to wait for in between (``wait_stream``, ``wait_event``,
  an NCCL ``work.wait()``, which makes the current stream wait on NCCL's internal stream), completed.
  So for a transfer: ``start()`` on the current stream just before posting (NCCL's stream waits on the
  current stream at post time), ``work.wait()``, then ``stop()`` on the current stream: the span is
  the transfer as this rank's GPU saw it, including waiting for a late peer.
* If the host calls ``stop()`` after the stream went idle, the end event fires when enqueued: the span
  then includes that host delay (it is never shorter than the device work).
* Both events on one stream of one device; the elapsed time (``cudaEventElapsedTime``, ~0.5 us
  resolution) is valid only once the end event completed: ``seconds()`` returns None before that,
  or blocks with ``wait=True``.

On the CPU (or with ``device`` a CPU device) a span is ``perf_counter`` from ``start()`` to ``stop()``.
``PhaseTimings`` keeps spans until they resolve and writes them to an ``EventLog`` with
``duration_s`` = device seconds (``clock: "cuda"``) or host seconds (``clock: "host"``), plus
``host_s`` (the enqueue span) for comparison.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch


class Span:
    """One phase on one stream (CUDA events) or on the host (perf_counter)."""

    def __init__(self, device: torch.device | str = "cpu", stream=None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and stream is None:
            stream = torch.cuda.current_stream(self.device)
        self.stream = stream
        self._start_ev = self._end_ev = None
        self.start_unix: float | None = None
        self._t0: float | None = None
        self._t1: float | None = None

    def start(self) -> "Span":
        self.start_unix, self._t0 = time.time(), time.perf_counter()
        if self.cuda:
            self._start_ev = torch.cuda.Event(enable_timing=True)
            self._start_ev.record(self.stream)
        return self

    def stop(self) -> "Span":
        if self._t0 is None:
            raise RuntimeError("Span.stop() before start()")
        if self.cuda:
            self._end_ev = torch.cuda.Event(enable_timing=True)
            self._end_ev.record(self.stream)
        self._t1 = time.perf_counter()
        return self

    @property
    def stopped(self) -> bool:
        return self._t1 is not None

    @property
    def host_seconds(self) -> float | None:
        """Host time from ``start()`` to ``stop()`` (the enqueue time on a GPU)."""
        return None if self._t1 is None or self._t0 is None else self._t1 - self._t0

    def ready(self) -> bool:
        """Stopped, and (on a GPU) the end event completed: ``seconds()`` answers without waiting."""
        if not self.stopped:
            return False
        return not self.cuda or bool(self._end_ev.query())

    def seconds(self, wait: bool = False) -> float | None:
        """Device seconds on a GPU, host seconds on a CPU; None while not ready (``wait``: block on the
        end event instead; the only host sync timing ever does, and only when asked)."""
        if not self.stopped:
            return None
        if not self.cuda:
            return self.host_seconds
        if not self._end_ev.query():
            if not wait:
                return None
            self._end_ev.synchronize()
        return self._start_ev.elapsed_time(self._end_ev) / 1e3

    @property
    def clock(self) -> str:
        return "cuda" if self.cuda else "host"


@contextmanager
def span(device: torch.device | str = "cpu", stream=None) -> Iterator[Span]:
    """``with span(dev, stream) as s: ...`` starts and stops a ``Span`` around the body."""
    s = Span(device, stream).start()
    try:
        yield s
    finally:
        s.stop()


class PhaseTimings:
    """Spans of named phases kept until resolved, then written as events.

        timings = PhaseTimings(device)
        s = timings.begin("round/transfer", round=3, bytes=n)   # before posting
        ...; work.wait(); timings.end(s)                         # after the wait
        ...                                                      # later, after a synchronisation:
        timings.flush(events)                                    # one record per span
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._pending: list[tuple[str, Span, dict[str, Any]]] = []

    def begin(self, phase: str, stream=None, **fields: Any) -> Span:
        s = Span(self.device, stream).start()
        self._pending.append((phase, s, fields))
        return s

    def end(self, s: Span) -> Span:
        return s.stop()

    @contextmanager
    def phase(self, phase: str, stream=None, **fields: Any) -> Iterator[dict[str, Any]]:
        """The body as a span; the yielded dict may take more fields (like ``EventLog.phase``)."""
        extra: dict[str, Any] = {}
        s = Span(self.device, stream).start()
        self._pending.append((phase, s, fields))
        try:
            yield extra
        finally:
            s.stop()
            fields.update(extra)

    def __len__(self) -> int:
        return len(self._pending)

    def resolve(self, wait: bool = False) -> list[dict[str, Any]]:
        """The spans that are ready (all stopped ones with ``wait``), as records ``{phase, start,
        duration_s, host_s, clock, **fields}``; they leave the pending list, the others stay."""
        out, keep = [], []
        for phase, s, fields in self._pending:
            sec = s.seconds(wait=wait) if s.stopped else None
            if sec is None:
                keep.append((phase, s, fields))
                continue
            out.append({"phase": phase, "start": s.start_unix, "duration_s": sec, "host_s": s.host_seconds,
                        "clock": s.clock, **fields})
        self._pending = keep
        return out

    def flush(self, events, wait: bool = True) -> int:
        """Write the resolved spans to ``events`` (an ``EventLog``); returns how many were written."""
        recs = self.resolve(wait=wait)
        for r in recs:
            r = dict(r)
            phase, start, dur = r.pop("phase"), r.pop("start"), r.pop("duration_s")
            events.record(phase, start, dur, **r)
        return len(recs)
