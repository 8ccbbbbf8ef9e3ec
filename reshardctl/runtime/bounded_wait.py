"""Every wait of a rank bounded: posted ops complete within the run's timeout or fail, and a rank stops
waiting at once when another rank published a failure of the same attempt (``Abandoned``). gloo waits
run in a helper thread while this thread watches the store (``run_bounded``); on NCCL the host blocks
in one CUDA event while ``deadline_watch.py`` holds the deadline and aborts (``abort.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import threading
import time

import torch

from reshardctl.errors import TransferError
from reshardctl.runtime.abort import abort_data_plane, on_nccl
from reshardctl.runtime.deadline_watch import DeadlineWatch

if TYPE_CHECKING:  # annotations only: groups.py imports this module
    from reshardctl.runtime.groups import Groups


class Abandoned(TransferError):
    """This rank stopped waiting because another rank published a failure of the same attempt first
    (a knock-on failure: the root cause is elsewhere)."""


def wait_works(works, groups: "Groups | None", timeout_s: float, what: str, *, device: bool | None = None) -> None:
    """Wait for posted ops, bounded: complete (or raise: a dead peer, a backend timeout) within
    ``timeout_s``, and stop at once when another rank published a failure of this attempt
    (``Abandoned``). gloo works (``device`` False, or a CPU data plane) are waited in a helper thread
    (their ``wait`` blocks, bounded by the group timeout) while this thread watches the store
    (``run_bounded``). NCCL works (``device``, default: the data plane is CUDA): ``work.wait()`` orders
    the current stream after the transfer, then this thread blocks in one ``Event.synchronize()`` on
    that stream while a ``DeadlineWatch`` thread holds the deadline and the store's failure check and
    aborts reshardctl's communicators past the one or at the other (the abort ends the kernels and so
    releases the blocked thread; the process lives on to report)."""
    works = list(works)
    if not works:
        return
    if device is None:
        device = on_nccl(groups)
    if not device:
        run_bounded(lambda: wait_all(works), groups, timeout_s, what)
        return
    watch = DeadlineWatch(timeout_s, abort=lambda: abort_data_plane(groups), failure=groups.failure)
    watch.watch(works, what)
    error: BaseException | None = None
    with watch:
        try:
            for w in works:
                w.wait()  # NCCL: the current stream waits for the transfer; the host does not
            done = torch.cuda.Event(blocking=True)  # blocking: the host sleeps in the wait, no spin
            done.record(torch.cuda.current_stream(groups.device))
            done.synchronize()
        except RuntimeError as exc:  # an aborted or failed communicator
            error = exc
    raise_outcome(watch.outcome, what, timeout_s)
    if error is not None:
        raise error


def raise_outcome(outcome, what: str, timeout_s: float) -> None:
    """A ``DeadlineWatch`` that aborted as an exception: ``Abandoned`` (another rank's failure) or
    ``TransferError`` (past the deadline); nothing when it did not abort."""
    if outcome is None:
        return
    if outcome.kind == "failure":
        raise Abandoned(f"{what}: stopped waiting: {outcome.record}")
    raise TransferError(f"{what}: not complete within {timeout_s:g} s")


def wait_all(works) -> None:
    """Each work's blocking ``wait()`` (gloo: bounded by its group's timeout, raises on a dead peer)."""
    for w in works:
        w.wait()


def start_helper(job) -> tuple[threading.Event, list[BaseException]]:
    """Start ``job()`` in a daemon helper thread: (an event set when it ends, the error it raised if
    any). ``run_bounded`` waits on it while watching the store; calibration times a control round the
    same way (calibrate/microbench.py)."""
    done, err = threading.Event(), []

    def run() -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            err.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="reshardctl-wait", daemon=True).start()
    return done, err


def run_bounded(job, groups: "Groups | None", timeout_s: float, what: str) -> None:
    """``job()``, whose blocking gloo waits are each bounded by their group's timeout, in a helper thread
    while this thread watches the store: returns when it is done (re-raising its error), raises
    ``Abandoned`` as soon as another rank published a failure of this attempt, ``TransferError`` past
    ``timeout_s`` (the helper thread is a daemon: a wait gloo has not yet timed out does not hold the
    process). Without a store: ``job()`` here."""
    if groups is None or groups.store is None:
        job()
        return
    done, err = start_helper(job)
    end = time.monotonic() + timeout_s + 1.0  # the backend's own timeout fires first
    next_check = time.monotonic() + 0.05
    while not done.wait(0.05):
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.1
            rec = groups.failure()
            if rec is not None:
                raise Abandoned(f"{what}: stopped waiting: {rec}")
        if now > end:
            raise TransferError(f"{what}: not complete within {timeout_s:g} s")
    if err:
        raise err[0]
