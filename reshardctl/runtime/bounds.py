"""How long a run waits for a rank that has gone silent: one set of bounds for both launchers.

A failure ends a run within ``timeout_s`` plus a few seconds, whoever launched it:

* the ranks that detect a failure report it within ``timeout_s`` (refit.py, groups.py);
* ``QUIET_S`` after the last report, once a failure is known, a rank still silent is given up
  (hung or stopped): the local launcher kills it (``launch/local.py``); on Slurm the ranks that
  reported stop waiting for it (``runtime/report_wait.py``) and ``srun --wait`` kills it
  ``SRUN_SLACK_S`` after the first task ended (``launch/slurm_request.py``);
* with ``--retries`` the survivors first try to settle (up to ``timeout_s``): the quiet time grows by
  ``timeout_s``.
"""

from __future__ import annotations

import math

GRACE_S = 5.0  # after the first failure: survivors report within timeout_s + this, or are given up
QUIET_S = 2.0  # once a failure is known, no report for this long: the silent ranks are given up
SRUN_SLACK_S = 3.0  # srun: from the first task's end to killing the rest, beyond QUIET_S


def quiet_s(timeout_s: float, retries: int) -> float:
    """No report for this long after a failure: the ranks still silent are hung or stopped."""
    return QUIET_S + (timeout_s if retries else 0.0)


def srun_wait_s(timeout_s: float, retries: int) -> int:
    """``srun --wait``: seconds from the first task's end until srun kills the others. The first task
    to end is a dead rank (its survivors report within ``quiet_s`` of it) or a rank that reported and
    stopped waiting (every other rank reported, or ``quiet_s`` passed without news): the rest are silent."""
    return int(math.ceil(quiet_s(timeout_s, retries) + SRUN_SLACK_S))
