"""The validation refit of `reshardctl rollback --verify`: one gather-and-broadcast session.

The only place the runbook starts ranks, through ``runs.session.run_refit_session`` with the site's launcher
(the profile's ``launcher``: processes on this machine, or Slurm jobs).
"""

from __future__ import annotations

from reshardctl.request.resolve import Inputs
from reshardctl.runs.session import SessionResult, run_refit_session

TRANSPORT = "gather_broadcast"


def validation_refit(inp: Inputs, *, iterations: int, warmup: int, out: str | None,
                     argv: list[str] | None) -> SessionResult:
    """Run gather-and-broadcast with ``inp``'s layouts; never raises for a failed refit (the result says)."""
    return run_refit_session(inp, [TRANSPORT], iterations=iterations, warmup=warmup, out=out, argv=argv,
                       launcher=inp.site.launcher)


def verified(result: SessionResult) -> bool:
    s = ((result.summary or {}).get("transports") or {}).get(TRANSPORT) or {}
    return result.ok and bool(s.get("verified")) and not s.get("failures")
