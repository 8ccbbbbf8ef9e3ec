"""A run's events as a Chrome trace-event JSON object (the format Perfetto and chrome://tracing open).

Pure: the events (``runs/records.py`` reads them) in, the trace dict out; ``reshardctl trace`` writes it.

* One process (``pid`` 1, named after the run) and one track per rank: ``tid`` = the global rank, named
  ``trainer 3`` / ``inference 5`` (the global rank) by ``thread_name`` metadata, ordered by rank.
* Each phase is a complete (``"X"``) slice, ``ts`` / ``dur`` in microseconds from the earliest event; an
  ``attempt`` event is the refit's own slice (``refit step 3``, ``warm-up`` marked, ``attempt k`` for a
  retry), so its rounds (``round/transfer r1``), buckets, verify and commit nest inside it. Where no
  ``attempt`` event encloses a step's refit phases (an API refit writes none), a refit slice is derived
  from them (first start to last end, ``args.derived`` true; ``otherData.derived_refits`` counts them).
* A slice that overlaps the one it starts in without ending inside it (a pipelined round: round 1 packs
  while round 0 is on the wire) cannot nest on one track; it goes to an overflow track of the same rank
  (``tid`` = rank + k * ``LANE_STRIDE``, named ``inference 2 (overlap k)``), so every track nests strictly.
  Ends within ``TOLERANCE_US`` of the enclosing slice's end (the events' microsecond rounding) are
  clamped to it.
* A phase that raised (``error_type`` / ``error``) adds an instant (``"i"``) event at its end, named
  ``<phase> failed: <error_type>``, with the error text in ``args``; a fired fault drill (``drill``) is an
  instant at its time.
* Every other field of an event (``step``, ``transport``, ``round``, ``bytes``, ``peers``, ...) is in ``args``.
* ``otherData`` says what was left out: event lines that were not events, logs that could not be read,
  events without a rank or a start time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PID = 1
LANE_STRIDE = 1 << 20  # overflow tracks: tid = rank + lane * LANE_STRIDE (above any rank: MAX_WORLD is smaller)
TOLERANCE_US = 2  # start and duration are rounded to the microsecond apart: an end 2 us past its parent nests
STRUCTURAL = ("phase", "rank", "side", "start", "duration_s")
ROLES = {"train": "trainer", "infer": "inference"}
REFIT_PHASES = ("round/", "bucket/")  # with verify, verify/full, commit and decide: the phases of one refit


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _rank(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < LANE_STRIDE else None


def slice_name(ev: Mapping[str, Any]) -> str:
    """``refit step 3 (warm-up)``, ``round/transfer r1``, ``bucket/gather b4``, ``verify``."""
    phase = str(ev.get("phase"))
    if phase == "attempt":
        name = f"refit step {ev.get('step')}"
        if ev.get("attempt"):
            name += f" attempt {ev.get('attempt')}"
        return name + (" (warm-up)" if ev.get("warmup") else "")
    if ev.get("round") is not None:
        return f"{phase} r{ev.get('round')}"
    if ev.get("bucket") is not None:
        return f"{phase} b{ev.get('bucket')}"
    return phase


def _category(phase: str) -> str:
    if phase == "attempt":
        return "refit"
    return phase.split("/", 1)[0]


def _args(ev: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k not in STRUCTURAL}


def _lanes(slices: list[dict]) -> None:
    """Give each slice of one rank a lane (``slice["lane"]``) in which every slice nests strictly in the
    one it starts in, or starts after it ended; clamp ends within ``TOLERANCE_US`` of the parent's end."""
    stacks: list[list[dict]] = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        end = s["ts"] + s["dur"]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= s["ts"]:
                stack.pop()
            if not stack:
                break
            top_end = stack[-1]["ts"] + stack[-1]["dur"]
            if end <= top_end + TOLERANCE_US:
                s["dur"] = min(end, top_end) - s["ts"]
                break
        else:
            lane = len(stacks)
            stacks.append([])
        s["lane"] = lane
        stacks[lane].append(s)


def _in_refit(phase: str) -> bool:
    return phase.startswith(REFIT_PHASES) or phase in ("verify", "verify/full", "commit", "decide")


def _derive_refits(slices: dict[int, list[dict]]) -> int:
    """A refit slice for each rank and step whose refit phases no ``attempt`` event encloses (an API
    refit writes none): from its first phase's start to its last one's end, ``args.derived`` true.
    Returns how many were added."""
    added = 0
    for rank, rank_slices in slices.items():
        attempts = [s for s in rank_slices if s["cat"] == "refit"]
        loose: dict[Any, list[dict]] = {}
        for s in rank_slices:
            step = s["args"].get("step")
            if s["cat"] == "refit" or not _in_refit(s["args"].get("_phase", "")) or step is None:
                continue
            if not any(a["args"].get("step") == step and a["ts"] <= s["ts"]
                       and s["ts"] + s["dur"] <= a["ts"] + a["dur"] + TOLERANCE_US for a in attempts):
                loose.setdefault(str(step), []).append(s)
        for group in loose.values():
            ts = min(s["ts"] for s in group)
            end = max(s["ts"] + s["dur"] for s in group)
            step = group[0]["args"]["step"]
            warmup = any(s["args"].get("warmup") for s in group)
            args = {"step": step, "derived": True, "phases": len(group)}
            transports = {s["args"].get("transport") for s in group} - {None}
            if len(transports) == 1:
                args["transport"] = transports.pop()
            rank_slices.append({"name": slice_name({"phase": "attempt", "step": step, "warmup": warmup}),
                                "cat": "refit", "ph": "X", "ts": ts, "dur": end - ts, "pid": PID, "tid": rank,
                                "args": args})
            added += 1
    for rank_slices in slices.values():
        for s in rank_slices:
            s["args"].pop("_phase", None)
    return added


def build_trace(events: Iterable[Mapping[str, Any]], *, name: str, skipped_lines: int = 0,
                skipped_logs: Sequence[str] = ()) -> dict[str, Any]:
    """The trace of ``events`` (any order, any ranks); ``name`` names the process (the run directory).
    ``skipped_lines`` / ``skipped_logs``: what the reader left out, recorded in ``otherData``."""
    usable, unusable = [], 0
    for ev in events:
        rank, start = _rank(ev.get("rank")), _number(ev.get("start"))
        if rank is None or start is None or not isinstance(ev.get("phase"), str):
            unusable += 1
            continue
        dur = _number(ev.get("duration_s"))
        usable.append((rank, start, max(dur or 0.0, 0.0), ev))
    t0 = min((start for _, start, _, _ in usable), default=0.0)

    def us(seconds: float) -> int:
        return round(seconds * 1e6)

    slices: dict[int, list[dict]] = {}
    instants: list[dict] = []
    sides: dict[int, str] = {}
    for rank, start, dur, ev in usable:
        sides.setdefault(rank, str(ev.get("side") or "rank"))
        ts = us(start - t0)
        phase = ev["phase"]
        if phase == "drill":
            instants.append({"name": f"drill: {ev.get('drill') or ev.get('kind') or 'fault'}", "cat": "drill",
                             "ph": "i", "s": "t", "ts": ts, "pid": PID, "tid": rank, "args": _args(ev)})
            continue
        slices.setdefault(rank, []).append({"name": slice_name(ev), "cat": _category(phase), "ph": "X", "ts": ts,
                                            "dur": us(dur), "pid": PID, "tid": rank,
                                            "args": {**_args(ev), "_phase": phase}})
        if ev.get("error_type") is not None or ev.get("error") is not None:
            instants.append({"name": f"{phase} failed: {ev.get('error_type') or 'error'}", "cat": "failure",
                             "ph": "i", "s": "t", "ts": ts + us(dur), "pid": PID, "tid": rank,
                             "args": {"error": ev.get("error"), **_args(ev)}})

    derived = _derive_refits(slices)
    meta: list[dict] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": name}}]
    out: list[dict] = []
    for rank in sorted(set(slices) | {i["tid"] for i in instants}):
        rank_slices = slices.get(rank, [])
        _lanes(rank_slices)
        role = ROLES.get(sides.get(rank, ""), sides.get(rank, "rank"))
        for lane in sorted({0} | {s["lane"] for s in rank_slices}):
            tid = rank + lane * LANE_STRIDE
            label = f"{role} {rank}" + (f" (overlap {lane})" if lane else "")
            meta.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": label}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid,
                         "args": {"sort_index": rank * 64 + min(lane, 63)}})
        for s in rank_slices:
            s["tid"] = rank + s.pop("lane") * LANE_STRIDE
            out.append(s)
    out.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    instants.sort(key=lambda e: e["ts"])
    return {
        "traceEvents": meta + out + instants,
        "displayTimeUnit": "ms",
        "otherData": {"source": name, "start_unix": t0, "events": len(usable),
                      "ranks": len(set(slices) | {i["tid"] for i in instants}),
                      "skipped_lines": skipped_lines, "skipped_logs": list(skipped_logs),
                      "unusable_events": unusable, "derived_refits": derived},
    }
