"""runtime/cuda_timing.py on the CPU: spans are host perf_counter spans, resolved and written as events.
(The CUDA-event path runs in `reshardctl selftest --gpu`, check stream_order.)"""

from __future__ import annotations

import time

import pytest

from reshardctl.runtime.cuda_timing import PhaseTimings, Span, span
from reshardctl.runs.records import read_events
from reshardctl.runtime.events import EventLog


def test_cpu_span_is_host_time():
    s = Span("cpu")
    assert not s.ready() and s.seconds() is None and s.clock == "host"
    with pytest.raises(RuntimeError, match="before start"):
        s.stop()
    s.start()
    time.sleep(0.02)
    s.stop()
    assert s.ready() and s.seconds() == s.host_seconds and 0.015 < s.seconds() < 1.0
    with span("cpu") as t:
        time.sleep(0.01)
    assert t.seconds() >= 0.005


def test_phase_timings_resolve_and_flush_to_events(tmp_path):
    timings = PhaseTimings("cpu")
    s = timings.begin("round/transfer", round=3, bytes=100)
    time.sleep(0.01)
    unfinished = timings.begin("round/transfer", round=4)  # not stopped: stays pending
    timings.end(s)
    with timings.phase("bucket/broadcast", bucket=1) as extra:
        extra["peers"] = [2, 3]
    assert len(timings) == 3
    recs = timings.resolve()
    assert [r["phase"] for r in recs] == ["round/transfer", "bucket/broadcast"] and len(timings) == 1
    assert recs[0]["round"] == 3 and recs[0]["clock"] == "host" and recs[0]["duration_s"] >= 0.005
    assert recs[1]["peers"] == [2, 3]
    timings.end(unfinished)
    log = EventLog(tmp_path, 0, "train")
    assert timings.flush(log) == 1 and len(timings) == 0
    log.close()
    (ev,) = read_events(tmp_path / "events" / "rank-0.jsonl")
    assert ev["phase"] == "round/transfer" and ev["round"] == 4 and ev["clock"] == "host"
    assert ev["duration_s"] == pytest.approx(ev["host_s"], abs=1e-5)
