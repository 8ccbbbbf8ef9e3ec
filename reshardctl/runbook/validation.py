"""The validation refit of `reshardctl rollback --verify`: one gather-and-broadcast session.

The only place the runbook starts ranks, through ``runs.session.run_refit_session`` with the site's launcher
(the profile's ``launcher``: processes on this machine, or Slurm jobs).
"""

from __future__ import annotations

from reshardctl.request.request import RunSettings
from reshardctl.request.resolve import Inputs
from reshardctl.runbook.transport_source import flag_record
from reshardctl.runs.session import SessionResult, run_refit_session

TRANSPORT = "gather_broadcast"


def settings(*, iterations: int, warmup: int, launcher: str) -> RunSettings:
    """The run settings of a validation refit: gather-and-broadcast on the site's launcher."""
    return RunSettings(transports=(TRANSPORT,), iterations=iterations, warmup=warmup, launcher=launcher)


def validation_refit(inp: Inputs, *, out: str | None, argv: list[str] | None) -> SessionResult:
    """Run ``inp``'s request (its run settings: ``settings``); never raises for a failed refit (the result says)."""
    rs = inp.request.run
    return run_refit_session(inp, list(rs.transports), iterations=rs.iterations, warmup=rs.warmup, out=out,
                             argv=argv, launcher=rs.launcher, transport_source=flag_record(TRANSPORT))


def verified(result: SessionResult) -> bool:
    s = ((result.summary or {}).get("transports") or {}).get(TRANSPORT) or {}
    return result.ok and bool(s.get("verified")) and not s.get("failures")
