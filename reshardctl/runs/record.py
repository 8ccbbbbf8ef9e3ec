"""``record.json``: what a runbook needs to trust or reproduce a run, beside its figures.

Written when the run directory is made (versions, UTC start time, the resolved site profile and its
sha256, the timeouts) and again with the summary (plus each rank's host and the backends the ranks
used, from their reports). ``summary.json`` carries the same object under ``record``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path

RECORD_JSON = "record.json"


def _torch_version() -> str | None:
    try:
        import torch

        return str(torch.__version__)
    except Exception:  # noqa: BLE001 - a record without torch still records the rest
        return None


def profile_sha256(profile: dict) -> str:
    """sha256 of the resolved profile as canonical JSON (sorted keys), ``source`` left out: the same
    settings give the same hash wherever the file lives."""
    body = {k: v for k, v in profile.items() if k != "source"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def utc_iso(unix: float) -> str:
    """ISO 8601 UTC with a ``Z`` suffix, to the second: ``2026-11-30T11:15:44Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def static_record(site, *, started: float, timeout_s: float, rendezvous_timeout_s: float | None,
                  launcher: str) -> dict:
    """The part known before any rank starts."""
    from reshardctl import __version__
    from reshardctl.site.spec import profile_to_dict

    prof = profile_to_dict(site)
    return {
        "reshardctl_version": __version__,
        "torch_version": _torch_version(),
        "python_version": platform.python_version(),
        "started_at_utc": utc_iso(started),
        "launcher": launcher,
        "site": site.name,
        "site_profile_sha256": profile_sha256(prof),
        "site_profile": prof,
        "timeouts": {"timeout_s": timeout_s,
                     "rendezvous_timeout_s": rendezvous_timeout_s if rendezvous_timeout_s is not None else timeout_s},
        "hosts": {},
        "backend": None,
    }


def full_record(static: dict | None, reports: dict | None) -> dict:
    """``static`` plus, from the ranks' reports (``{transport: [RankReport]}``), ``hosts`` (rank -> host
    name) and ``backend`` (``gloo``/``nccl``; several joined with ``+`` if the ranks disagree)."""
    rec = dict(static or {})
    hosts: dict[int, str] = {}
    backends: set[str] = set()
    for rs in (reports or {}).values():
        for r in rs:
            if r.host:
                hosts.setdefault(r.global_rank, r.host)
            if r.backend:
                backends.add(r.backend)
    rec["hosts"] = {str(k): v for k, v in sorted(hosts.items())}
    rec["backend"] = "+".join(sorted(backends)) or None
    return rec


def write_record(run_dir: Path, record: dict) -> Path:
    from reshardctl.runs.rundir import write_json

    return write_json(Path(run_dir) / RECORD_JSON, record)
