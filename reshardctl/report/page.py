"""The report page: content built once as blocks, rendered as markdown or as one self-contained HTML file.

Per run: site, model, layouts, plan fingerprints, predicted vs measured per transport, speedup over
gather-and-broadcast, lower bound and efficiency (lower bound / measured median), verification, failures
and recovery attempts, Slurm job ids and states (summary.json ``slurm``, when present), and the plots.
Several runs add a before/after table (first run vs last) per transport.
"""

from __future__ import annotations

import base64
import html
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reshardctl.report.collect import RunData

BASELINE = "gather_broadcast"


@dataclass(frozen=True)
class Block:
    kind: str  # h1 | h2 | p | table | img | code
    text: str = ""
    rows: tuple = ()  # table: (header, *rows)
    src: str = ""  # img: file name next to the page


def _s(x: Any) -> str:
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.2f} ms"


def _median(s: dict) -> float | None:
    v = (s.get("refit_s") or {}).get("median")
    return v if isinstance(v, (int, float)) else None


def _transport_rows(run: RunData) -> tuple:
    head = ("transport", "predicted", "measured median", "p90", "vs gather_broadcast", "lower bound",
            "efficiency", "verified", "iterations", "plan fingerprint")
    base = _median(run.transports.get(BASELINE) or {})
    rows = [head]
    for t, s in run.transports.items():
        med = _median(s)
        lb = s.get("lower_bound_s")
        speed = f"{base / med:.2f}x faster" if base and med and t != BASELINE else "-"
        eff = f"{100 * lb / med:.1f}%" if isinstance(lb, (int, float)) and med else "-"
        rows.append((t, _s(s.get("predicted_s")), _s(med), _s((s.get("refit_s") or {}).get("p90")), speed, _s(lb),
                     eff, "yes" if s.get("verified") else "NO", str(s.get("iterations", "-")), s.get("fingerprint") or "-"))
    return tuple(rows)


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
    """summary.json ``slurm``: ``job_ids`` (role -> id), ``states`` / ``exit_codes`` (job -> ...), ``mode``,
    ``nodes``, ``queue_s`` / ``startup_s`` / ``run_s``; keys it does not know are listed as they are."""
    sl = run.summary.get("slurm")
    if not sl:
        return []
    if not isinstance(sl, dict):
        return [Block("h2", "Slurm"), Block("p", str(sl))]
    out = [Block("h2", "Slurm jobs")]
    ids = sl.get("job_ids") if isinstance(sl.get("job_ids"), dict) else {}
    states = sl.get("states") if isinstance(sl.get("states"), dict) else {}
    codes = sl.get("exit_codes") if isinstance(sl.get("exit_codes"), dict) else {}
    rows = [("role", "job id", "state", "exit code")]
    listed = set()
    for role, jid in ids.items():
        mine = sorted(k for k in states if k == str(jid) or k.startswith((f"{jid}+", f"{jid}_")))  # het / array parts
        for j in mine or [str(jid)]:
            rows.append((str(role), j, str(states.get(j, "-")), str(codes.get(j, "-"))))
            listed.add(j)
    for j in states:
        if j not in listed:
            rows.append(("-", j, str(states[j]), str(codes.get(j, "-"))))
    if len(rows) > 1:
        out.append(Block("table", rows=tuple(rows)))
    rest = [(str(k), _s(v) if k.endswith("_s") else str(v)) for k, v in sl.items()
            if k not in ("job_ids", "states", "exit_codes")]
    if rest:
        out.append(Block("table", rows=(("", ""), *rest)))
    return out


def build(runs: list[RunData], images: dict[str, str]) -> list[Block]:
    """``images``: plot key (``latency``, ``timeline-<i>``, ``bytes-<i>``) -> PNG file name."""
    blocks = [Block("h1", "reshardctl refit report"),
              Block("p", f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from "
                         f"{len(runs)} run director{'y' if len(runs) == 1 else 'ies'}.")]
    if len(runs) > 1:
        blocks += _comparison(runs)
    blocks += [Block("h2", "Refit latency"), Block("img", "refit latency per transport", src=images["latency"])]
    for i, run in enumerate(runs):
        inp = run.inputs
        blocks += [
            Block("h1", f"Run {run.label}"),
            Block("table", rows=(("", ""), ("run directory", str(run.run_dir)), ("command", run.summary.get("command", "-")),
                                 ("site", str(inp.get("site"))), ("model", f"{inp.get('model')} ({inp.get('model_source')})"),
                                 ("train layout", str(inp.get("train"))), ("infer layout", str(inp.get("infer"))),
                                 ("iterations",
                                  f"{run.summary.get('iterations')} timed + {run.summary.get('warmup')} warm-up"),
                                 ("session ok", "yes" if run.summary.get("ok") else "NO"))),
            Block("h2", "Predicted vs measured"),
            Block("table", rows=_transport_rows(run)),
            Block("p", "Efficiency = the physical lower bound / the measured median. Speedup = gather_broadcast's "
                       "median / the transport's, both from this run."),
            Block("h2", "Verification, failures and recovery"),
            *_failures(run),
            *_slurm(run),
            Block("h2", "Phases per rank"), Block("img", f"timeline of {run.label}", src=images[f"timeline-{i}"]),
            Block("h2", "Bytes per rank"), Block("img", f"bytes per rank of {run.label}", src=images[f"bytes-{i}"]),
        ]
        if run.bad_event_lines:
            blocks.append(Block("p", f"{run.bad_event_lines} unreadable event lines were skipped."))
    return blocks


def _comparison(runs: list[RunData]) -> list[Block]:
    first, lastr = runs[0], runs[-1]
    names = [t for t in first.transports if t in lastr.transports]
    head = ("transport", *(r.label for r in runs), "after / before")
    rows = [head]
    for t in names:
        meds = [_median(r.transports.get(t) or {}) for r in runs]
        ratio = f"{meds[-1] / meds[0]:.2f}x" if meds[0] and meds[-1] else "-"
        rows.append((t, *(_s(m) for m in meds), ratio))
    return [Block("h2", f"Before / after: {first.label} -> {lastr.label}"), Block("table", rows=tuple(rows)),
            Block("p", "Median refit per run; after / before < 1 means the later run is faster.")]


def _md_cell(x: str) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}\n")
        elif b.kind == "h2":
            out.append(f"## {b.text}\n")
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
        if b.kind in ("h1", "h2"):
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
