"""The report page: content built once as blocks, rendered as markdown or as one self-contained HTML file.

First, per site and model ("within budget, and what changed?"): the latency-over-time plot (every refit
of the reported runs and API refits against the budget line, the runbook decisions marked), whether the
active transport's latest median and p90 are within the budget, the decisions of the site's ledger
(promote and rollback), and a before/after of the transport that changed: per ledger change of the
active transport, the previously active transport's measured median and p90 against the newly active
one's (from the change's own run when it measured both, else the latest run before / the first run after
it, else the ledger entry's figures); without a change, the first run's active transport against the
last run's. Then per run: site, model, layouts, plan fingerprints, predicted vs measured per transport,
speedup over gather-and-broadcast, lower bound and efficiency (lower bound / measured median),
verification, failures and recovery attempts, Slurm job ids, states and timings (summary.json ``slurm``,
when present), and the plots.

Every cell is a human value: times through ``units`` with one unit per table, sizes in binary units,
unix times as UTC, booleans yes/no, lists joined, mappings as ``key: value, ...``.
"""

from __future__ import annotations

import base64
import html
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reshardctl import units
from reshardctl.report.collect import History, RunData
from reshardctl.report.history import SiteLedger, entry_time, grouped
from reshardctl.runbook.ledger import Entry

BASELINE = "gather_broadcast"


@dataclass(frozen=True)
class Block:
    kind: str  # h1 | h2 | h3 | p | table | img | code
    text: str = ""
    rows: tuple = ()  # table: (header, *rows)
    src: str = ""  # img: file name next to the page


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def utc(t: float | None) -> str:
    """A Unix time as UTC text; "-" for no number, the number itself where no calendar date has it (a
    damaged record's 6.8e16 s: ``gmtime`` overflows)."""
    if not _num(t):
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:g} s (not a date)"


def time_column(values: list[float | None], among: list[float | None] | None = None) -> list[str]:
    """Seconds in one unit for a whole column (``units.time_unit`` of the largest of ``among``, default
    the column's own values)."""
    name, scale = units.time_unit(values if among is None else among)
    return [f"{v / scale:.{0 if name == 'us' else 3 if name == 's' else 2}f} {name}" if _num(v) else "-"
            for v in values]


def _table(head: tuple, rows: list[list], time_cols: tuple[int, ...] = ()) -> Block:
    """A table whose ``time_cols`` hold seconds (or None), all in one unit (a median and the p90 or budget
    beside it compare at a glance)."""
    rows = [list(r) for r in rows]
    every = [r[c] for r in rows for c in time_cols]
    for c in time_cols:
        for r, text in zip(rows, time_column([r[c] for r in rows], every)):
            r[c] = text
    return Block("table", rows=(head, *(tuple(str(c) for c in r) for r in rows)))


def human(key: str, v: Any) -> str:
    """One value of a record as an operator reads it (``*_at``: a UTC time, ``*_s``: seconds,
    ``*_bytes``: a size, booleans yes/no, lists joined, mappings ``key: value, ...``)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if _num(v) and key.endswith("_at"):
        return utc(v)
    if _num(v) and key.endswith("_s"):
        return units.seconds(v)
    if _num(v) and key.endswith("bytes"):
        return units.size(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(human(key, x) for x in v) or "-"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {human(str(k), x)}" for k, x in v.items()) or "-"
    return str(v)


def _figure(s: dict, key: str = "median") -> float | None:
    v = (s.get("refit_s") or {}).get(key)
    return v if _num(v) else None


def _median(s: dict) -> float | None:
    return _figure(s, "median")


def _transport_rows(run: RunData) -> Block:
    head = ("transport", "predicted", "measured median", "p90", "vs gather_broadcast", "lower bound",
            "efficiency", "verified", "iterations", "plan fingerprint")
    base = _median(run.transports.get(BASELINE) or {})
    rows = []
    for t, s in run.transports.items():
        med = _median(s)
        lb = s.get("lower_bound_s") if _num(s.get("lower_bound_s")) else None
        speed = f"{base / med:.2f}x faster" if base and med and t != BASELINE else "-"
        eff = f"{100 * lb / med:.1f}%" if lb is not None and med else "-"
        rows.append([t, s.get("predicted_s") if _num(s.get("predicted_s")) else None, med, _figure(s, "p90"), speed,
                     lb, eff, "yes" if s.get("verified") else "NO", str(s.get("iterations", "-")),
                     s.get("fingerprint") or "-"])
    return _table(head, rows, (1, 2, 3, 5))


def _failures(run: RunData) -> list[Block]:
    out: list[Block] = []
    rows = [("transport", "rank", "side", "error", "message")]
    for t, s in run.transports.items():
        for f in s.get("failures") or []:
            rows.append((t, str(f.get("rank")), str(f.get("side")), str(f.get("error")), str(f.get("message"))[:200]))
    recovery = {t: s.get("recovery") or s.get("recovery_attempts") or s.get("retries")
                for t, s in run.transports.items()}
    recovery = {t: v for t, v in recovery.items() if v}
    top = run.summary.get("recovery") or run.summary.get("recovery_attempts")
    failed_phases = [seg for seg in run.segments if seg.error]
    if failed_phases:
        ev = [("phase", "rank", "transport", "step", "error")] + [
            (seg.phase, str(seg.rank), seg.transport, str(seg.step), seg.error) for seg in failed_phases[:10]]
        out.append(Block("p", f"Phases that raised (events/): {len(failed_phases)}"
                              + (" (first 10)" if len(failed_phases) > 10 else "")))
        out.append(Block("table", rows=tuple(ev)))
    if len(rows) == 1 and not recovery and not top and not failed_phases and run.summary.get("ok", True):
        return [Block("p", "Failures: none; recovery attempts: none.")]
    if run.summary.get("error"):
        out += [Block("p", "Session error:"), Block("code", str(run.summary["error"]))]
    if len(rows) > 1:
        out.append(Block("table", rows=tuple(rows)))
    for t, v in recovery.items():
        out.append(Block("p", f"Recovery attempts ({t}): {v}"))
    if top:
        out.append(Block("p", f"Recovery attempts: {top}"))
    return out


def _slurm(run: RunData) -> list[Block]:
    """summary.json ``slurm``: ``job_ids`` (role -> id), ``states`` / ``exit_codes`` (job -> ...), and the
    rest (``mode``, ``nodes``, ``submitted_at``, ``scripts``, ``queue_s``, ...) as human values."""
    sl = run.summary.get("slurm")
    if not sl:
        return []
    if not isinstance(sl, dict):
        return [Block("h2", "Slurm"), Block("p", human("slurm", sl))]
    out = [Block("h2", "Slurm jobs")]
    ids = sl.get("job_ids") if isinstance(sl.get("job_ids"), dict) else {}
    states = sl.get("states") if isinstance(sl.get("states"), dict) else {}
    codes = sl.get("exit_codes") if isinstance(sl.get("exit_codes"), dict) else {}
    rows = [("role", "job id", "state", "exit code")]
    listed = set()
    for role, jid in ids.items():
        mine = sorted(k for k in states if k == str(jid) or k.startswith((f"{jid}+", f"{jid}_")))  # het / array parts
        for j in mine or [str(jid)]:
            rows.append((str(role), j, human("state", states.get(j)), human("exit_code", codes.get(j))))
            listed.add(j)
    for j in states:
        if j not in listed:
            rows.append(("-", j, human("state", states[j]), human("exit_code", codes.get(j))))
    if len(rows) > 1:
        out.append(Block("table", rows=tuple(rows)))
    rest = [(str(k), human(str(k), v)) for k, v in sl.items() if k not in ("job_ids", "states", "exit_codes")]
    if rest:
        out.append(Block("table", rows=(("", ""), *rest)))
    return out


# ---- within budget, and what changed? -------------------------------------------------------------------


def active_transport(run: RunData) -> str | None:
    """The transport a run's job would refit with: summary ``transport_source`` (bench: the site's active
    one), else the run's only transport."""
    src = run.summary.get("transport_source")
    t = src.get("transport") if isinstance(src, dict) else None
    if isinstance(t, str) and t in run.transports:
        return t
    return next(iter(run.transports)) if len(run.transports) == 1 else None


def _same_dir(a: str | None, b: Path) -> bool:
    try:
        return a is not None and Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _measured(runs: list[RunData], t: str, at: float, entry: Entry, after: bool) -> tuple[float | None, float | None,
                                                                                              str]:
    """(median, p90, where from) of transport ``t`` around a change at ``at``: the change's own run when it
    measured ``t``; else the latest run before (``after`` False) or the first run after it; else the
    ledger entry's own figures when it names ``t``."""
    have = [r for r in runs if _median(r.transports.get(t) or {}) is not None]
    own = [r for r in have if _same_dir(entry.run_dir, r.run_dir)]
    side = [r for r in have if (r.t0 >= at if after else r.t0 < at)]
    pick = own[0] if own else (side[0] if after and side else side[-1] if side else None)
    if pick is not None:
        s = pick.transports[t]
        return _median(s), _figure(s, "p90"), pick.label
    if entry.transport == t and _num(entry.median_s):
        return entry.median_s, entry.p90_s if _num(entry.p90_s) else None, "ledger"
    return None, None, "-"


def _ratio(after: float | None, before: float | None) -> str:
    return f"{after / before:.2f}x" if _num(after) and _num(before) and before else "-"


def _changes(runs: list[RunData], led: SiteLedger) -> list[Block]:
    rows = []
    active = led.transport or BASELINE
    for e in led.entries:
        if not e.changes_active:
            continue
        before = e.details.get("active_before") if isinstance(e.details.get("active_before"), str) else active
        if before == e.transport:  # promoted what was already active (e.g. the profile's default): no change
            active = e.transport
            continue
        at = entry_time(e) or 0.0
        bm, bp, bfrom = _measured(runs, before, at, e, after=False)
        am, ap, afrom = _measured(runs, e.transport, at, e, after=True)
        what = f"{e.action} ({e.verdict})"
        rows.append([utc(at), what, before, bm, bp, e.transport, am, ap, _ratio(am, bm), _ratio(ap, bp),
                     bfrom if bfrom == afrom else f"{bfrom} / {afrom}"])
        active = e.transport
    if not rows:
        return []
    head = ("time", "change", "before", "median", "p90", "after", "median", "p90", "median after/before",
            "p90 after/before", "measured in")
    return [Block("h3", "Before / after: the transport that changed"), _table(head, rows, (3, 4, 6, 7)),
            Block("p", "Per change of the active transport: the previously active transport against the newly "
                       "active one, from the change's own run when it measured both, else the latest run before "
                       "and the first run after it. after/before < 1: the change made refits faster.")]


def _first_last(runs: list[RunData]) -> list[Block]:
    first, lastr = runs[0], runs[-1]
    rows = []
    for run in (first, lastr):
        t = active_transport(run)
        s = run.transports.get(t) or {}
        rows.append([run.label, t or "-", _median(s), _figure(s, "p90")])
    ratio = [_ratio(rows[1][2], rows[0][2]), _ratio(rows[1][3], rows[0][3])]
    return [Block("h3", f"Before / after: {first.label} -> {lastr.label}"),
            _table(("run", "active transport", "median", "p90"), rows, (2, 3)),
            Block("p", f"No change of the active transport recorded: each run's active transport, first run against "
                       f"last; after/before: median {ratio[0]}, p90 {ratio[1]} (< 1: the later run is faster).")]


def _decisions(led: SiteLedger) -> list[Block]:
    rows = []
    for e in led.entries:
        if e.action not in ("promote", "rollback"):
            continue
        b = e.budget_s if _num(e.budget_s) else None
        within = "-" if b is None or not _num(e.median_s) else "yes" if e.median_s <= b and (
            not _num(e.p90_s) or e.p90_s <= b) else "NO"
        rows.append([utc(entry_time(e)), e.user or "-", e.action, e.verdict, e.transport,
                     e.median_s if _num(e.median_s) else None, e.p90_s if _num(e.p90_s) else None, b, within,
                     e.reason or "-"])
    if not rows:
        return [Block("p", f"Decisions: none recorded in {led.path}.")]
    head = ("time", "user", "action", "verdict", "transport", "median", "p90", "budget", "within budget", "reason")
    return [Block("h3", "Decisions (site ledger)"), _table(head, rows, (5, 6, 7))]


def _verdict(h: History, runs: list[RunData], led: SiteLedger | None) -> Block:
    active, since = (led.transport if led else None), None
    for e in (led.entries if led else []):
        if e.changes_active:
            active, since = e.transport, e
    have = [r for r in runs if _median(r.transports.get(active or "") or {}) is not None]
    if active is None or not have:
        return Block("p", f"Active transport: {active or 'unknown'}; no reported run measured it.")
    s = have[-1].transports[active]
    med, p90 = _median(s), _figure(s, "p90")
    cols = time_column([med, p90, h.budget_s])
    ok = h.budget_s is not None and med is not None and med <= h.budget_s and p90 is not None and p90 <= h.budget_s
    answer = "budget unknown" if h.budget_s is None else "within budget" if ok else "NOT within budget"
    why = f" since {utc(entry_time(since))} ({since.action} {since.verdict})" if since else " (the profile's)"
    return Block("p", f"Active transport: {active}{why}. Latest measured ({have[-1].label}): median {cols[0]}, "
                      f"p90 {cols[1]} against the budget {cols[2]}: {answer}.")


def overview(histories: list[History], runs: list[RunData], ledgers: dict[str, SiteLedger], site: str | None,
             image: str, gone: list[str] = ()) -> list[Block]:
    """The top section: per site and model, within budget and what changed."""
    out = [Block("h2", "Within budget, and what changed?"),
           Block("img", "refit latency over time per site and model, against the budget", src=image),
           Block("p", "Every refit of the reported runs and API refits over time (warm-up and failed attempts "
                      "marked), the site's budget, the plan's predicted time and lower bound, and the "
                      "promote / rollback decisions of the site ledger.")]
    for d in gone:
        out.append(Block("p", f"Run directory {d} (named in the ledger): no longer on disk."))
    for h, ((spec, _), group) in zip(histories, grouped(runs, site).items()):
        led = ledgers.get(spec) if spec else None
        mine = sorted(group, key=lambda r: r.t0)
        out.append(Block("h2", f"{h.site or 'site unknown'}: {h.model}"))
        if led and led.note:
            out.append(Block("p", led.note))
        out.append(_verdict(h, mine, led))
        if led and led.entries:
            out += _decisions(led)
        changes = _changes(mine, led) if led else []
        out += changes or (_first_last(mine) if len(mine) > 1 else [])
    return out


def build(runs: list[RunData], images: dict[str, str], histories: list[History] | None = None,
          ledgers: dict[str, SiteLedger] | None = None, site: str | None = None, gone: list[str] = ()) -> list[Block]:
    """``images``: plot key (``history``, ``latency``, ``timeline-<i>``, ``bytes-<i>``) -> PNG file name."""
    blocks = [Block("h1", "reshardctl refit report"),
              Block("p", f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from "
                         f"{len(runs)} run director{'y' if len(runs) == 1 else 'ies'}.")]
    if histories is not None and "history" in images:
        blocks += overview(histories, runs, ledgers or {}, site, images["history"], gone)
    blocks += [Block("h2", "Refit latency per run"),
               Block("img", "refit latency per transport", src=images["latency"])]
    for i, run in enumerate(runs):
        blocks += [Block("h1", f"Run {run.label}"), _inputs(run),
                   Block("h2", "Predicted vs measured"),
                   _transport_rows(run),
                   Block("p", "Efficiency = the physical lower bound / the measured median. Speedup = "
                              "gather_broadcast's median / the transport's, both from this run."),
                   Block("h2", "Verification, failures and recovery"),
                   *_failures(run),
                   *_slurm(run),
                   Block("h2", "Phases per rank"), Block("img", f"timeline of {run.label}", src=images[f"timeline-{i}"]),
                   Block("h2", "Bytes per rank"), Block("img", f"bytes per rank of {run.label}", src=images[f"bytes-{i}"])]
        if run.bad_event_lines:
            blocks.append(Block("p", f"{run.bad_event_lines} unreadable event lines were skipped."))
    return blocks


def _inputs(run: RunData) -> Block:
    inp = run.inputs
    if run.api:
        return Block("table", rows=(("", ""), ("events directory", str(run.run_dir)),
                                    ("source", "API refits (Refitter events_dir): no summary.json, figures from the events"),
                                    ("site", human("site", inp.get("site"))),
                                    ("plan fingerprints", human("fingerprints", inp.get("fingerprints"))),
                                    ("refits", str(run.summary.get("iterations"))),
                                    ("all committed", "yes" if run.summary.get("ok") else "NO")))
    return Block("table", rows=(
        ("", ""), ("run directory", str(run.run_dir)), ("command", human("command", run.summary.get("command"))),
        ("started", utc(run.t0) if run.segments else "-"),
        ("site", human("site", inp.get("site"))),
        ("model", f"{human('model', inp.get('model'))} ({human('model_source', inp.get('model_source'))})"),
        ("train layout", human("train", inp.get("train"))), ("infer layout", human("infer", inp.get("infer"))),
        ("iterations", f"{human('iterations', run.summary.get('iterations'))} timed + "
                       f"{human('warmup', run.summary.get('warmup'))} warm-up"),
        ("session ok", "yes" if run.summary.get("ok") else "NO")))


def _md_cell(x: str) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}\n")
        elif b.kind == "h2":
            out.append(f"## {b.text}\n")
        elif b.kind == "h3":
            out.append(f"### {b.text}\n")
        elif b.kind == "p":
            out.append(f"{b.text}\n")
        elif b.kind == "img":
            out.append(f"![{b.text}]({b.src})\n")
        elif b.kind == "code":
            out.append(f"```\n{b.text}\n```\n")
        elif b.kind == "table":
            head, *rows = b.rows
            out.append("| " + " | ".join(_md_cell(h) for h in head) + " |")
            out.append("|" + "|".join("---" for _ in head) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
            out.append("")
    return "\n".join(out)


def to_html(blocks: list[Block], image_dir: Path) -> str:
    """One file: images embedded as base64 data URIs."""
    e = html.escape
    body: list[str] = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            body.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{e(b.text)}</p>")
        elif b.kind == "code":
            body.append(f"<pre>{e(b.text)}</pre>")
        elif b.kind == "img":
            data = base64.b64encode((image_dir / b.src).read_bytes()).decode()
            body.append(f'<figure><img alt="{e(b.text)}" src="data:image/png;base64,{data}"><figcaption>{e(b.text)}'
                        "</figcaption></figure>")
        elif b.kind == "table":
            head, *rows = b.rows
            body.append("<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in head) + "</tr>"
                        + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
                        + "</table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;}table{border-collapse:collapse;"
             "margin:1em 0;}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;}"
             "img{max-width:100%;}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>reshardctl refit report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
