"""Failure records of a refit session, whatever the launcher: root cause first, then knock-on failures.

A record (dict) names rank, host, side, side rank, phase, step, round, peers, error and message, and
``at`` (unix time) and ``knock_on`` (it stopped because another rank failed). Ranks that left no report
come from the launcher (``RankLost``); the others from the ranks' own reports (``RankReport.failure``).
"""

from __future__ import annotations

import os

from reshardctl.runtime.contract import RankReport


def last_event(run_dir: str | os.PathLike | None, rank: int) -> dict:
    """The rank's drill event if it has one, else its last event (where a rank without a report was)."""
    if not run_dir:
        return {}
    from reshardctl.runtime.events import read_events

    try:
        ev = read_events(os.path.join(run_dir, "events", f"rank-{rank}.jsonl"))
    except (OSError, ValueError):
        return {}
    drill = [e for e in ev if e.get("phase") == "drill"]
    return drill[-1] if drill else (ev[-1] if ev else {})


def where_lost(run_dir: str | os.PathLike | None, rank: int) -> dict:
    """Where a rank that left no report was, from the last event it wrote: ``phase`` (a drill's own
    phase), ``step``, ``round`` (or bucket) and ``drill``; all None when it wrote none."""
    last = last_event(run_dir, rank)
    return {"phase": last.get("at") or last.get("phase"), "step": last.get("step"),
            "round": last.get("round", last.get("bucket")), "drill": last.get("drill")}


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


def ranks_text(ranks: list[int]) -> str:
    """``rank 3`` / ``ranks 0-3`` / ``ranks 0, 2, 5``."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def knock_on_text(others: list[dict]) -> str:
    """The failures after the root cause in one line, grouped by error and phase (never their messages,
    which repeat the root cause): ``7 other ranks stopped because of it: ranks 0-3 TransferError in
    transfer, rank 4 Abandoned in transfer, ranks 6, 7 Abandoned in verify``."""
    groups: dict[tuple, list[int]] = {}
    for f in others:
        groups.setdefault((f.get("error") or "failed", f.get("phase")), []).append(f["rank"])
    parts = [f"{ranks_text(rs)} {err}" + (f" in {phase}" if phase else "") for (err, phase), rs in groups.items()]
    n = len(others)
    return f"{n} other rank{'s' if n != 1 else ''} stopped because of it: " + ", ".join(parts)


def failure_text(failures: list[dict], prefix: str = "run failed") -> str:
    """A failed session in at most two lines: the root cause once, in full, then the knock-on failures
    summarised (each rank's record is in ``summary.json``)."""
    text = f"{prefix}: root cause: {failure_line(failures[0])}"
    if len(failures) > 1:
        text += "\n  " + knock_on_text(failures[1:])
    return text
