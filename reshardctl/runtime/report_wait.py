"""A rank started by Slurm waits, after writing its report, for the other ranks' reports: bounded.

Rank 0 hosts the run's store, so it stays until the others reported; every other rank stays too, so
that the first task to end (which starts ``srun --wait``'s clock, ``runtime/bounds.py``) is never
one that leaves slower peers still writing their reports in a successful run. A rank stops waiting when

* every rank has a report (``reports/rank-N.json``) or has ended (``logs/rank-N.exit``, written by the
  task's shell when the rank's process ends, however it ended: a killed rank is known at once);
* a failure is known (its own report failed, or a rank ended without a report) and no rank reported or
  ended for ``quiet_s`` (the ranks still silent are hung or stopped: srun kills them);
* ``timeout_s`` + ``GRACE_S`` passed (a backstop).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from reshardctl.runtime.bounds import GRACE_S, quiet_s

POLL_S = 0.2
_REPORT = re.compile(r"^rank-(\d+)\.json$")
_EXIT = re.compile(r"^rank-(\d+)\.exit$")


def _ranks(directory: Path, pattern: re.Pattern) -> set[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    return {int(m.group(1)) for m in map(pattern.match, names) if m}


def await_reports(run_dir: Path, world: int, *, failed: bool, timeout_s: float, retries: int = 0) -> str:
    """Wait as above; returns why it stopped: ``all``, ``quiet`` or ``backstop``."""
    end = time.monotonic() + timeout_s + GRACE_S
    quiet = quiet_s(timeout_s, retries)
    seen, last_change = -1, time.monotonic()
    while True:
        reported = _ranks(run_dir / "reports", _REPORT)
        ended = _ranks(run_dir / "logs", _EXIT)
        done = len((reported | ended) & set(range(world)))
        if done >= world:
            return "all"
        now = time.monotonic()
        if done != seen:
            seen, last_change = done, now
        if (failed or ended - reported) and now - last_change > quiet:
            return "quiet"
        if now > end:
            return "backstop"
        time.sleep(POLL_S)
