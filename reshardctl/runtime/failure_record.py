"""A failure record: where one rank of a refit session failed, whatever the launcher.

Built in three places (a rank's own failure, ``runtime/refit.py``; a rank the local launcher lost,
``launch/local.py``; a rank the Slurm jobs lost, ``launch/slurm.py``), published in the store for the
peers, carried in ``RankReport.failure``, ordered by ``launch/failures.py`` and summarised in
``summary.json`` (``runs/failures.py``). On the wire (store, report, summary) it is the JSON object of
``to_json``, the same keys as ever; ``from_json`` reads one back, tolerantly (a key missing or of the
wrong kind reads as None: the record of an older or newer rank never fails the summary of a run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

RANK_LOST = "RankLost"  # the error of a rank that left no report (the launcher's record)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _time(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


@dataclass(frozen=True)
class FailureRecord:
    rank: int | None
    side: str | None = None  # "train" | "infer"
    side_rank: int | None = None
    host: str | None = None
    phase: str | None = None  # where it failed (a lost rank: its last event's phase)
    step: int | None = None
    round: int | None = None  # round (or bucket) index
    step_kind: str | None = None
    peers: list | None = None
    at: float | None = None  # unix time of the failure (a lost rank: when the launcher saw it)
    knock_on: bool = False  # it stopped because another rank failed
    error: str | None = None  # the error's type (``RankLost``: no report)
    message: str | None = None
    drill: str | None = None  # a lost rank's drill, when its last event was one

    def to_json(self) -> dict[str, Any]:
        """The wire form: every field, in declaration order (``None`` where unknown)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> FailureRecord:
        """A record read back (from the store, a report or summary.json); a field missing or of the wrong
        kind reads as None."""
        d = d if isinstance(d, Mapping) else {}
        peers = d.get("peers")
        return cls(rank=_int(d.get("rank")), side=_str(d.get("side")), side_rank=_int(d.get("side_rank")),
                   host=_str(d.get("host")), phase=_str(d.get("phase")), step=_int(d.get("step")),
                   round=_int(d.get("round")), step_kind=_str(d.get("step_kind")),
                   peers=list(peers) if isinstance(peers, (list, tuple)) else None, at=_time(d.get("at")),
                   knock_on=d.get("knock_on") is True, error=_str(d.get("error")), message=_str(d.get("message")),
                   drill=_str(d.get("drill")))

    def with_error(self, error: str | None, message: str | None) -> FailureRecord:
        return replace(self, error=error, message=message)
