"""The per-user index of Slurm runs (``reshardctl jobs`` lists it): one JSON line per submitted run.

Kept in the per-user state directory, ``$XDG_STATE_HOME/reshardctl/`` (default
``~/.local/state/reshardctl/``), file ``slurm-runs.jsonl``, appended under an exclusive lock so that
concurrent submissions never lose a line. A line that cannot be read is reported, never rewritten.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import InputError
from reshardctl.launch.slurm_cli import check_job_id

INDEX = "slurm-runs.jsonl"
MAX_INDEX_BYTES = 64 << 20


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "reshardctl"


def record_run(entry: dict) -> Path:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / INDEX
    line = json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock
    return path


def _check_entry(where: str, entry: object) -> dict:
    if not isinstance(entry, dict) or "run_dir" not in entry or "job_ids" not in entry:
        raise InputError(f"{where}: not a run record (needs run_dir and job_ids)")
    if not isinstance(entry["run_dir"], str):
        raise InputError(f"{where}: `run_dir` must be a string, got {str(entry['run_dir'])[:80]!r}")
    if not isinstance(entry["job_ids"], dict):
        raise InputError(f"{where}: `job_ids` must be a JSON object role -> job id, got {str(entry['job_ids'])[:80]!r}")
    for role, job in entry["job_ids"].items():
        check_job_id(job, f"{where}: `job_ids.{role}`")
    t = entry.get("submitted_at", 0)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t < 1e11:
        raise InputError(f"{where}: `submitted_at` must be a unix time, got {str(t)[:40]!r}")
    return entry


def list_runs() -> list[dict]:
    """Every record of the index (bounded: a regular file of at most ``MAX_INDEX_BYTES``), each checked:
    job ids must be Slurm job ids before any command sees them."""
    path = state_dir() / INDEX
    try:
        text = read_text(path, MAX_INDEX_BYTES)
    except LoadError as exc:
        if exc.missing:
            return []
        raise InputError(f"{path}: cannot be read: {exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = loads_json(line)
        except LoadError as exc:
            raise InputError(f"{path}, line {n}: not a JSON record ({exc}); the file is left as it is") from None
        out.append(_check_entry(f"{path}, line {n}", entry))
    return out
