"""Failure records of a refit session, whatever the launcher: root cause first, then knock-on failures.

A record is a ``FailureRecord`` (``runtime/failure_record.py``; on the wire its JSON object): rank, host,
side, side rank, phase, step, round, peers, error and message, ``at`` (unix time) and ``knock_on`` (it
stopped because another rank failed). Ranks that left no report come from the launcher (``RankLost``,
``lost_record``); the others from the ranks' own reports (``RankReport.failure``).
"""

from __future__ import annotations

import os

from reshardctl.runs.records import last_event
from reshardctl.runtime.contract import RankReport
from reshardctl.runtime.failure_record import RANK_LOST, FailureRecord


def where_lost(run_dir: str | os.PathLike | None, rank: int) -> dict:
    """Where a rank that left no report was, from the last event it wrote: ``phase`` (a drill's own
    phase), ``step``, ``round`` (or bucket) and ``drill``; all None when it wrote none."""
    last = last_event(run_dir, rank)
    return {"phase": last.get("at") or last.get("phase"), "step": last.get("step"),
            "round": last.get("round", last.get("bucket")), "drill": last.get("drill")}


def lost_record(rank: int, side: str | None, side_rank: int | None, host: str | None, at: float, why: str,
                run_dir: str | os.PathLike | None) -> dict:
    """The launcher's record of a rank that left no report (``RankLost``), where it was from its events."""
    where = FailureRecord.from_json(where_lost(run_dir, rank))
    return FailureRecord(rank=rank, side=side, side_rank=side_rank, host=host, phase=where.phase, step=where.step,
                         round=where.round, at=at, knock_on=False, error=RANK_LOST, message=why,
                         drill=where.drill).to_json()


def order_failures(lost: list[dict], reports: list[RankReport]) -> list[dict]:
    """Root cause first: ranks without a report, then ranks that failed on their own (earliest first),
    then the knock-on failures (ranks that stopped because another rank failed)."""
    recs = []
    for r in reports:
        if r.ok:
            continue
        f = dict(r.failure) if r.failure else FailureRecord(rank=r.global_rank, side=r.side, side_rank=r.side_rank,
                                                              host=r.host).to_json()
        f.update(error=r.error_type, message=r.error_message)
        recs.append(f)
    own = sorted((f for f in recs if not f.get("knock_on")), key=lambda f: f.get("at") or 0.0)
    knock = sorted((f for f in recs if f.get("knock_on")), key=lambda f: f.get("at") or 0.0)
    return sorted(lost, key=lambda f: f["at"]) + own + knock


def failure_line(rec: dict) -> str:
    """One line: ``rank 3 (infer 1, host, phase verify, step 2): TransferError: ...``."""
    f = FailureRecord.from_json(rec)
    where = ", ".join(x for x in (
        f"{f.side} {f.side_rank}", f.host or "", f"phase {f.phase}" if f.phase else "",
        f"step {f.step}" if f.step is not None else "", f"round {f.round}" if f.round is not None else "",
        f"peers {f.peers}" if f.peers else "") if x)
    return f"rank {f.rank} ({where}): {f.error}: {f.message}"


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
    for f in map(FailureRecord.from_json, others):
        groups.setdefault((f.error or "failed", f.phase), []).append(f.rank)
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
