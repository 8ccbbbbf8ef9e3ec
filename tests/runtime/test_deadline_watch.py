"""The deadline watcher of the stream-ordered NCCL data path (runtime/deadline_watch.py), on CPU.

Works are stand-ins (``is_completed`` from the clock: NCCL cannot run here); the failure check reads a
real ``TCPStore``. Bounds are relative to the configured timeout, never wall-clock limits.
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from reshardctl.runtime.deadline_watch import DeadlineWatch


class ClockWork:
    """A posted transfer that completes ``after`` seconds from now (never, with None)."""

    def __init__(self, after: float | None):
        self.at = None if after is None else time.monotonic() + after

    def is_completed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


def _store():
    return dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)


def _failure(store):
    return lambda: store.get("failed").decode() if store.check(["failed"]) else None


def _ended(w: DeadlineWatch, bound: float) -> None:
    """Wait (bounded) for the watch's thread to end on its own."""
    t = w._thread
    t.join(bound)
    assert not t.is_alive()


def _until_done(w: DeadlineWatch, bound: float) -> None:
    """Wait (bounded) until the watch has nothing pending or has aborted."""
    end = time.monotonic() + bound
    while w.pending() and w.outcome is None and time.monotonic() < end:
        time.sleep(0.01)


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "reshardctl-deadline" and t.is_alive()]


def test_aborts_once_at_the_deadline_naming_the_step():
    aborts = []
    timeout = 0.5
    w = DeadlineWatch(timeout, abort=lambda: aborts.append(time.monotonic()), poll_s=0.005, grace_s=0.0)
    t0 = time.monotonic()
    w.watch([ClockWork(0.0)], "step 1")
    w.watch([ClockWork(0.0), ClockWork(None)], "step 2")  # one work of step 2 never completes
    w.start()
    _ended(w, timeout + 10)
    w.stop()
    assert len(aborts) == 1 and w.aborts == 1
    assert w.outcome.kind == "timeout" and w.outcome.label == "step 2"
    assert aborts[0] - t0 >= timeout
    assert aborts[0] - t0 < timeout + 5
    assert not _watchers()


def test_stops_and_aborts_at_a_failure_published_in_the_store_long_before_the_deadline():
    store = _store()
    aborts = []
    timeout = 60.0
    w = DeadlineWatch(timeout, abort=lambda: aborts.append(1), failure=_failure(store), poll_s=0.005, check_s=0.02)
    w.watch([ClockWork(None)], "round 3")
    with w:
        t0 = time.monotonic()
        store.set("failed", "rank 5 failed in round 3: connection reset")
        _ended(w, timeout)
        seen = time.monotonic() - t0
    assert aborts == [1]
    assert w.outcome.kind == "failure" and w.outcome.label == "round 3"
    assert w.outcome.record == "rank 5 failed in round 3: connection reset"
    assert seen < timeout / 4
    assert not _watchers()


def test_never_aborts_after_completion_even_past_the_deadline_or_with_a_failure_published():
    store = _store()
    aborts = []
    timeout = 0.2
    w = DeadlineWatch(timeout, abort=lambda: aborts.append(1), failure=_failure(store), poll_s=0.005,
                      check_s=0.01, grace_s=0.0)
    w.watch([ClockWork(0.05)], "step 1")
    with w:
        _until_done(w, 20 * timeout)
        store.set("failed", "rank 1 failed later")  # after this rank's transfers completed
        time.sleep(4 * timeout)  # well past the deadline: nothing pending, nothing to abort
        assert w._thread.is_alive()
    assert aborts == [] and w.outcome is None
    assert not _watchers()


def test_each_step_is_bounded_from_when_the_one_before_completed_not_from_when_it_was_posted():
    """Steps posted together (the host never blocks per step): step 2's bound starts when step 1
    completed, as ``wait_works``'s bound started when the host reached it."""
    aborts = []
    timeout = 1.0
    w = DeadlineWatch(timeout, abort=lambda: aborts.append(1), poll_s=0.005, grace_s=0.0)
    w.watch([ClockWork(0.8 * timeout)], "step 1")
    w.watch([ClockWork(1.6 * timeout)], "step 2")  # past its post + timeout, within step 1's end + timeout
    with w:
        _until_done(w, 10 * timeout)
    assert aborts == [] and w.outcome is None


def test_no_thread_left_behind_whichever_way_the_watch_ends():
    before = len(_watchers())
    for works in ([ClockWork(0.0)], [ClockWork(None)], []):
        w = DeadlineWatch(30.0, abort=lambda: None, poll_s=0.005)
        w.watch(works, "x")
        with w:
            time.sleep(0.02)
        assert w._thread is None
    assert len(_watchers()) == before == 0
