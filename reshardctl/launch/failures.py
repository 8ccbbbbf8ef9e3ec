"""Failure records of a refit session, whatever the launcher: root cause first, then knock-on failures.

A record (dict) names rank, host, side, side rank, phase, step, round, peers, error and message, and
``at`` (unix time) and ``knock_on`` (it stopped because another rank failed). Ranks that left no report
come from the launcher (``RankLost``); the others from the ranks' own reports (``RankReport.failure``).
"""

from __future__ import annotations

from reshardctl.runtime.contract import RankReport


def order_failures(lost: list[dict], reports: list[RankReport]) -> list[dict]:
    """Root cause first: ranks without a report, then ranks that failed on their own (earliest first),
    then the knock-on failures (ranks that stopped because another rank failed)."""
    recs = []
    for r in reports:
        if r.ok:
            continue
        f = dict(r.failure or {"rank": r.global_rank, "side": r.side, "side_rank": r.side_rank, "at": None,
                               "knock_on": False, "host": r.host})
        f.update(error=r.error_type, message=r.error_message)
        recs.append(f)
    own = sorted((f for f in recs if not f.get("knock_on")), key=lambda f: f.get("at") or 0.0)
    knock = sorted((f for f in recs if f.get("knock_on")), key=lambda f: f.get("at") or 0.0)
    return sorted(lost, key=lambda f: f["at"]) + own + knock


def failure_line(f: dict) -> str:
    """One line: ``rank 3 (infer 1, host, phase verify, step 2): TransferError: ...``."""
    where = ", ".join(x for x in (
        f"{f.get('side')} {f.get('side_rank')}", f.get("host") or "",
        f"phase {f['phase']}" if f.get("phase") else "", f"step {f['step']}" if f.get("step") is not None else "",
        f"round {f['round']}" if f.get("round") is not None else "",
        f"peers {f['peers']}" if f.get("peers") else "") if x)
    return f"rank {f['rank']} ({where}): {f.get('error')}: {f.get('message')}"
