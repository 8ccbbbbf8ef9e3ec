"""A signal before the job's time limit (``slurm.signal``, e.g. ``USR1@120``): the refit in progress ends
cleanly on every rank alike, and the run is recorded as stopped by the time limit.

Slurm sends the signal to every task of the job's steps (``--signal`` without ``B:``: the ranks, not the
batch shell). The job script exports ``RESHARDCTL_STOP_SIGNAL`` (``launch/slurm_request.py``); the worker
then ``arm``s a handler that only records the arrival. The ranks look at it at each refit boundary through
one control all-reduce (``commit.gather_steps``: any rank's flag stops all), so they all stop before the
same refit: the refit in progress when the signal came finishes (committed or rolled back by the commit
protocol: inference never holds half-new weights) and no new one starts. Each rank's report then says
``TimeLimitStop`` with the step it stopped before; ``record`` reads that back for the summary
(``interrupted: true`` and why).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from reshardctl.errors import TransferError

ENV = "RESHARDCTL_STOP_SIGNAL"
STOP_ERROR = "TimeLimitStop"


class TimeLimitStop(TransferError):
    """Every rank stopped at the same refit boundary: the job's time-limit signal arrived."""


class TimeLimit:
    """The arrival of the time-limit signal on this rank (``at``: epoch seconds, None until then)."""

    def __init__(self, signame: str):
        self.signame = signame
        self.at: float | None = None

    def _arrived(self, _signum, _frame) -> None:
        if self.at is None:
            self.at = time.time()

    def stop_before(self, groups, step: int, committed: int | None, gather) -> None:
        """Raise ``TimeLimitStop`` on every rank when any rank got the signal (one control all-reduce:
        ``gather(groups, flag, committed)`` = ``commit.gather_steps``)."""
        flags, steps = gather(groups, int(self.at is not None), committed)
        got = [r for r, f in enumerate(flags) if f]
        if got:
            known = [s for s in steps if s is not None]  # the inference ranks' (equal: one boundary) steps
            committed = min(known) if known else None
            when = f" at {time.strftime('%H:%M:%S', time.gmtime(self.at))} UTC" if self.at else ""
            raise TimeLimitStop(
                f"stopped before refit step {step}: the job's time-limit signal SIG{self.signame} reached rank(s) "
                f"{', '.join(map(str, got[:8]))}{' ...' if len(got) > 8 else ''}{when} (slurm.signal); every rank "
                f"stopped at this boundary, the inference weights stay at committed step {committed}")


def arm(environ=None) -> TimeLimit | None:
    """The handler of ``RESHARDCTL_STOP_SIGNAL`` (USR1 or USR2) when the job script set it; main thread only."""
    name = (os.environ if environ is None else environ).get(ENV, "").strip().upper()
    if name not in ("USR1", "USR2") or threading.current_thread() is not threading.main_thread():
        return None
    tl = TimeLimit(name)
    signal.signal(getattr(signal, f"SIG{name}"), tl._arrived)
    return tl


def record(session) -> dict | None:
    """``{"why", "ranks"}`` when the ranks' reports (``{plan: [RankReport]}``) say they stopped on the
    time-limit signal, else None."""
    stopped = [r for reports in session.values() for r in reports if r.error_type == STOP_ERROR]
    if not stopped:
        return None
    return {"why": stopped[0].error_message, "ranks": sorted({r.global_rank for r in stopped})}
