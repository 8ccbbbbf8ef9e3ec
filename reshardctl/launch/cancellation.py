"""Who cancelled a Slurm run, and when: ``reshardctl cancel`` records it in ``slurm/cancel.json`` (the
user, the time, each job's state before the cancel); a job cancelled with ``scancel`` (or by an
administrator) is known from accounting's ``CANCELLED by <uid>`` and its end time. The summary of a
cancelled run says so (``interrupted: true``, ``slurm.cancelled``) instead of reading like a crash."""

from __future__ import annotations

import getpass
import os
import pwd
import time
from pathlib import Path
from typing import Mapping

from reshardctl.atomic_write import write_json_atomic
from reshardctl.errors import InputError
from reshardctl.launch import slurm_cli
from reshardctl.runs.records import read_json_object

CANCEL_FILE = "slurm/cancel.json"
MAX_CANCEL_BYTES = 64 << 10


def _user_of(uid: str) -> str:
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError, OverflowError):
        return f"uid {uid}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def record_cancel(run_dir: str | Path, before: Mapping[str, str]) -> dict:
    """``reshardctl cancel``'s record: who, when, and each cancelled job's state just before."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    rec = {"by": user, "uid": os.getuid(), "at": _iso(time.time()), "via": "reshardctl cancel",
           "jobs": dict(before)}
    write_json_atomic(Path(run_dir) / CANCEL_FILE, rec, mode=0o600, indent=2)
    return rec


def _recorded(run_dir: str | Path, ids: list[str]) -> dict | None:
    """``slurm/cancel.json`` when it is a record of cancelling one of ``ids`` (else None: a file this tool
    did not write is not believed, and never fails the summary)."""
    try:
        rec = read_json_object(Path(run_dir) / CANCEL_FILE, MAX_CANCEL_BYTES)
    except InputError:
        return None
    if rec is None:
        return None
    jobs = rec.get("jobs")
    if not isinstance(jobs, dict) or not set(jobs) & set(ids) or not all(
            isinstance(rec.get(k), str) for k in ("by", "at", "via")):
        return None
    return {k: rec[k] for k in ("by", "at", "via", "jobs")}


def cancellation(run_dir: str | Path, ids: list[str], states: Mapping[str, slurm_cli.JobState],
                 cancelled_peer: str | None = None) -> dict | None:
    """Who cancelled this run and when, when one of its jobs ended CANCELLED by a person (not the other
    job of a two-jobs run cancelled by this tool after its peer failed): ``{"by", "at", "via", "jobs"}``,
    or None. ``reshardctl cancel``'s record first, else accounting's uid and end time."""
    peers = set((cancelled_peer or "").split(",")) - {""}
    cancelled = [j for j in ids if j in states and states[j].state == "CANCELLED" and j not in peers]
    if not cancelled:
        return None
    rec = _recorded(run_dir, ids)
    if rec is not None:
        return rec
    s = states[cancelled[0]]
    by = _user_of(s.cancelled_by) if s.cancelled_by else "unknown (accounting does not say)"
    at = s.end if s.end and s.end not in ("Unknown", "None") else "unknown"
    return {"by": by, "at": at, "via": "scancel or Slurm", "jobs": {j: "" for j in cancelled}}


def cancelled_text(c: Mapping) -> str:
    return f"cancelled by {c['by']} at {c['at']} ({c['via']})"
