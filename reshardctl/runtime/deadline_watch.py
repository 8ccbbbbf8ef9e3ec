"""The deadline of a stream-ordered wait, held by a helper thread (docs/gpu.md, "Stream discipline").

On NCCL the main thread does not poll: it enqueues each step's transfer, orders the consumers after it on
the device (``work.wait()``, stream and event waits) and blocks once, in ``Event.synchronize()``, where a
host must know completion. A ``DeadlineWatch`` thread holds what that main thread can no longer check:

* the deadline: each watched batch of works must complete within ``timeout_s`` (plus 1 s, so the
  backend's own timeout fires first) of becoming the oldest incomplete batch (when it was added, or when
  the batch before it completed): the same per-step bound ``bounded_wait.wait_works`` gave;
* the store's failure check (``failure()``: another rank published a failure of this attempt), every
  ``check_s``, while a batch is incomplete (with nothing pending there is nothing to release, and a
  watch never aborts work that completed).

On either it calls ``abort()`` once (``abort.abort_data_plane``: ``ncclCommAbort`` ends the kernels,
so a host blocked in ``Event.synchronize()`` is released), records why (``outcome``) and stops. A watch
whose works all completed never aborts; ``stop()`` joins the thread. Works need only ``is_completed()``
(torch's ``Work``, which does not block), so the class is tested on CPU with stand-ins.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Outcome:
    """Why a watch aborted: ``kind`` "timeout" (``label`` the batch past its deadline) or "failure"
    (``record`` the failure another rank published; ``label`` the oldest batch still incomplete)."""

    kind: str
    label: Any
    record: str | None = None


class DeadlineWatch:
    def __init__(self, timeout_s: float, *, abort: Callable[[], None], failure: Callable[[], str | None] = lambda: None,
                 poll_s: float = 0.01, check_s: float = 0.1, grace_s: float = 1.0):
        self.timeout_s = timeout_s
        self._abort = abort
        self._failure = failure
        self._poll = poll_s
        self._check = check_s
        self._grace = grace_s
        self._lock = threading.Lock()
        self._batches: deque = deque()  # [works, label, deadline or None]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.outcome: Outcome | None = None
        self.aborts = 0

    def __enter__(self) -> "DeadlineWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "DeadlineWatch":
        self._thread = threading.Thread(target=self._run, name="reshardctl-deadline", daemon=True)
        self._thread.start()
        return self

    def watch(self, works, label: Any = None) -> None:
        """Watch one batch of posted works (a step's), behind those already watched."""
        works = list(works)
        if works:
            with self._lock:
                self._batches.append([works, label, None])

    def stop(self) -> None:
        """End the watch (its works complete, or the caller gave up): the thread is joined."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def pending(self) -> int:
        with self._lock:
            return len(self._batches)

    def _front(self, now: float):
        """The oldest incomplete batch (its deadline set when it became the oldest); completed ones dropped."""
        with self._lock:
            while self._batches:
                b = self._batches[0]
                if b[2] is None:
                    b[2] = now + self.timeout_s + self._grace
                if all(w.is_completed() for w in b[0]):
                    self._batches.popleft()
                    now = time.monotonic()
                    continue
                return b
        return None

    def _fire(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.aborts += 1
        try:
            self._abort()
        finally:
            self._stop.set()

    def _run(self) -> None:
        next_check = time.monotonic() + self._check
        while not self._stop.wait(self._poll):
            now = time.monotonic()
            front = self._front(now)
            if front is not None and now >= next_check:  # nothing pending: nothing to release, no abort
                next_check = now + self._check
                try:
                    rec = self._failure()
                except Exception as exc:  # noqa: BLE001 - the store itself is gone: a failure too
                    rec = f"the run's store is unreachable: {exc}"
                if rec is not None:
                    self._fire(Outcome("failure", front[1], rec))
                    return
            if front is not None and now > front[2]:
                self._fire(Outcome("timeout", front[1]))
                return
