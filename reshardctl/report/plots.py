"""The report's PNG plots (matplotlib, Agg backend: no display needed on a login node).

* ``latency_over_time``: one panel per site and model; x: the runs and API refit series in time order
  (each gets an equal slot, its refits placed by time inside it, the gap to the next written between
  slots, so runs minutes apart and days apart both read; ticks give each slot's UTC start); y: refit
  latency (timed refits filled, warm-ups hollow, failed ones as x), the budget line with its value, each
  source's predicted (dashed) and lower bound (dotted) over its slot, and the ledger's promote / rollback
  decisions as vertical lines (refused or verify-failed ones grey).
* ``latency``: per transport (and per run, when comparing), a box of the timed refits (median line,
  mean diamond, the points), the budget line, the plan's predicted and lower bound per box.
* ``timeline``: per rank, set-up (rendezvous, group init, materialise ...) on its own axis at the left,
  the refits on the right with the gaps between them cut, warm-up refits shaded, steps and transports
  labelled.
* ``bytes_per_rank``: per rank, the bytes through its transfer phases in one refit, per transport, in one
  binary unit (``units.byte_unit``).

Colours, legend order and size come from ``report/style.py`` (the same in every plot); times and bytes
use one unit per axis from ``reshardctl/units.py``. Past ``style.MAX_RANK_ROWS`` ranks the per-rank plots
show the busiest ranks and say so. Each ``*_figure`` builds the matplotlib Figure (tests assert on its
artists); each plain function writes one PNG (960 px wide) and closes the figure.
"""

from __future__ import annotations

import bisect
import statistics
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from reshardctl.report import style  # noqa: E402
from reshardctl.report.collect import History, RunData  # noqa: E402
from reshardctl.units import byte_unit, time_unit  # noqa: E402

LOG_RATIO = 30.0  # a latency axis whose values span more than this factor is logarithmic
_PLAIN = FuncFormatter(lambda v, _pos: f"{v:g}")


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=style.DPI, format="png")
    plt.close(fig)


def _value(v: float) -> str:
    return f"{v:.3g}"


def _y_scale(ax, values: list[float]) -> None:
    """Logarithmic when the values (refits, budget, predictions) span more than LOG_RATIO, else linear;
    plain numbers either way."""
    pos = [v for v in values if v > 0]
    if pos and max(pos) / min(pos) > LOG_RATIO:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_PLAIN)


def _legend_handles(kinds: list[str], transports: list[str], patches: bool = False) -> list:
    """Legend entries: the transports, then ``kinds`` in style.LEGEND_ORDER."""
    hs: list = []
    for t in transports:
        c = style.transport_color(t)
        hs.append(Patch(facecolor=c, alpha=0.6, label=t) if patches
                  else Line2D([], [], color=c, marker="o", linestyle="none", label=t))
    grey = "#555555"
    make = {
        "timed refit": lambda: Line2D([], [], color=grey, marker="o", linestyle="none", label="timed refit"),
        "warm-up refit": lambda: Line2D([], [], color=grey, marker="o", markerfacecolor="none", linestyle="none",
                                        label="warm-up refit (untimed)"),
        "failed refit": lambda: Line2D([], [], color=grey, marker="x", linestyle="none", label="failed refit"),
        "mean": lambda: Line2D([], [], color="black", marker="D", markerfacecolor="white", linestyle="none",
                               label="mean"),
        "median": lambda: Line2D([], [], color="black", linewidth=1.5, label="median"),
        "predicted": lambda: Line2D([], [], color=grey, linestyle="--", label="predicted (plan)"),
        "lower bound": lambda: Line2D([], [], color=grey, linestyle=":", linewidth=1.8, label="lower bound"),
        "budget": lambda: Line2D([], [], color=style.BUDGET_COLOR, linewidth=1.5, label="budget"),
        "promote": lambda: Line2D([], [], color=style.MARK_COLORS["promote"], linewidth=1.2, label="promote"),
        "rollback": lambda: Line2D([], [], color=style.MARK_COLORS["rollback"], linewidth=1.2, label="rollback"),
        "refused / verify failed": lambda: Line2D([], [], color=style.MARK_COLORS["declined"], linewidth=1.2,
                                                  label="refused / verify failed"),
    }
    return hs + [make[k]() for k in style.LEGEND_ORDER if k in kinds]


def _budget_line(ax, budget_s: float, scale: float, unit: str) -> None:
    v = budget_s / scale
    ax.axhline(v, color=style.BUDGET_COLOR, linewidth=1.5, gid="budget", label=f"budget {_value(v)} {unit}",
               zorder=2)
    ax.annotate(f"budget {_value(v)} {unit}", xy=(1.0, v), xycoords=("axes fraction", "data"), ha="right",
                va="bottom", fontsize=8, color=style.BUDGET_COLOR)


# ---------------------------------------------------------------- latency over time

def _gap(seconds: float) -> str:
    for name, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"+{seconds / size:.0f} {name}" if seconds / size >= 10 else f"+{seconds / size:.1f} {name}"
    return f"+{seconds:.0f} s"


def _clusters(h: History) -> list[tuple[float, float, list[str]]]:
    """The sources' time spans, overlapping ones merged, in time order: one x slot each."""
    spans: dict[str, list[float]] = {}
    for r in h.refits:
        spans.setdefault(r.source, []).append(r.start_unix)
    for e in h.expectations:
        spans.setdefault(e.source, []).extend((e.start_unix, e.end_unix))
    out: list[tuple[float, float, list[str]]] = []
    for a, b, src in sorted((min(v), max(v), s) for s, v in spans.items()):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]), out[-1][2] + [src])
        else:
            out.append((a, b, [src]))
    return out


def _time_axis(clusters, marks: list[float]):
    """``x(t)``: slot i spans i+0.1 .. i+0.9 (linear in time inside); decisions between slots fall between."""
    kt: list[float] = []
    kx: list[float] = []
    for i, (a, b, _) in enumerate(clusters):
        if b > a:
            kt += [a, b]
            kx += [i + 0.1, i + 0.9]
        else:
            kt.append(a)
            kx.append(i + 0.5)
    if not kt:  # decisions only
        kt, kx = sorted(set(marks)), list(range(len(set(marks))))
    if marks and min(marks) < kt[0]:
        kt.insert(0, min(marks))
        kx.insert(0, kx[0] - 0.6)
    if marks and max(marks) > kt[-1]:
        kt.append(max(marks))
        kx.append(kx[-1] + 0.6)
    return lambda t: float(np.interp(t, kt, kx)) if len(kt) > 1 else kx[0]


def _history_panel(ax, h: History) -> set[str]:
    """Draw one site and model; return the legend kinds it used."""
    kinds: set[str] = set()
    if not (h.refits or h.expectations or h.marks):
        ax.text(0.5, 0.5, "no refits", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{h.site or '-'}: {h.model}", fontsize=10)
        return kinds
    values = [r.seconds for r in h.refits] + [v for e in h.expectations for v in (e.predicted_s, e.lower_bound_s)
                                              if v is not None]
    if h.budget_s is not None:
        values.append(h.budget_s)
    unit, scale = time_unit(values)
    clusters = _clusters(h)
    x = _time_axis(clusters, [m.time_unix for m in h.marks])
    for i in range(0, len(clusters), 2):
        ax.axvspan(i, i + 1, color="#000000", alpha=0.035, linewidth=0, zorder=0)
    for t in style.transport_order(r.transport for r in h.refits):
        c = style.transport_color(t)
        rs = [r for r in h.refits if r.transport == t]
        for kind, pick, kw in (("timed refit", lambda r: r.ok and not r.warmup, {"color": c}),
                               ("warm-up refit", lambda r: r.ok and r.warmup, {"facecolors": "none", "edgecolors": c}),
                               ("failed refit", lambda r: not r.ok, {"color": c, "marker": "x"})):
            sel = [r for r in rs if pick(r)]
            if sel:
                kinds.add(kind)
                ax.scatter([x(r.start_unix) for r in sel], [r.seconds / scale for r in sel], s=22, zorder=3,
                           gid=kind, linewidths=1.2, **kw)
    for e in h.expectations:
        x0, x1 = x(e.start_unix), x(e.end_unix)
        if x1 - x0 < 0.2:
            x0, x1 = (x0 + x1) / 2 - 0.15, (x0 + x1) / 2 + 0.15
        c = style.transport_color(e.transport)
        for kind, v, ls in (("predicted", e.predicted_s, "--"), ("lower bound", e.lower_bound_s, ":")):
            if v is not None:
                kinds.add(kind)
                ax.hlines(v / scale, x0, x1, colors=c, linestyles=ls, linewidth=1.6, gid=kind, zorder=2)
    if h.budget_s is not None:
        kinds.add("budget")
        _budget_line(ax, h.budget_s, scale, unit)
    last_x, low = None, False
    for m in sorted(h.marks, key=lambda m: m.time_unix):
        kind = style.mark_kind(m.action, m.verdict)
        kinds.add("refused / verify failed" if kind == "declined" else kind)
        c = style.MARK_COLORS[kind]
        xm = x(m.time_unix)
        ax.axvline(xm, color=c, linewidth=1.3, gid="mark", zorder=1)
        low = last_x is not None and xm - last_x < 0.12 and not low  # a close neighbour's label: stagger it
        last_x = xm
        ax.annotate(m.label, xy=(xm, 0.55 if low else 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    ha="right", va="top", fontsize=7, color="#444444" if kind == "declined" else c)
    # ticks: each slot's UTC start and source; the gap to the next slot between them
    every = max(1, -(-len(clusters) // 10))
    ticks, labels = [], []
    for i, (a, _b, srcs) in enumerate(clusters):
        if i % every == 0:
            when = datetime.fromtimestamp(a, tz=timezone.utc).strftime("%m-%d %H:%M")
            src = srcs[0] if len(srcs) == 1 else f"{len(srcs)} sources"
            ticks.append(i + 0.5)
            labels.append(f"{when}\n{src if len(src) <= 16 else src[:15] + '…'}")
        if i + 1 < len(clusters) and len(clusters) <= 12:
            ax.annotate(_gap(clusters[i + 1][0] - clusters[i][1]), xy=(i + 1, 0.01),
                        xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=7, color="#666666")
    ax.set_xticks(ticks, labels, fontsize=7)
    xs = [x(m.time_unix) for m in h.marks] + [0.0, float(max(1, len(clusters)))]
    ax.set_xlim(min(xs) - 0.15, max(xs) + 0.15)
    _y_scale(ax, [v / scale for v in values])
    ax.set_ylabel(f"refit latency ({unit})")
    ax.set_xlabel("runs and API refit series in time order (UTC start; equal slots, the gap between them written)",
                  fontsize=8)
    ax.set_title(f"{h.site or '-'}: {h.model}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return kinds


def latency_over_time_figure(histories: list[History]):
    hs = histories or [History(None, "", None)]
    per_panel = 3.3 if len(hs) <= 3 else 2.6  # many sites and models: shorter panels
    fig, axes = plt.subplots(len(hs), 1, figsize=(style.WIDTH_IN, 1.2 + per_panel * len(hs)), squeeze=False,
                             layout="constrained")
    kinds: set[str] = set()
    for ax, h in zip(axes[:, 0], hs):
        kinds |= _history_panel(ax, h)
    transports = style.transport_order(r.transport for h in hs for r in h.refits)
    handles = _legend_handles(sorted(kinds), transports)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)), fontsize=8, frameon=False)
    fig.suptitle("refit latency over time, against the budget", fontsize=11)
    return fig


def latency_over_time(histories: list[History], path: Path) -> None:
    """Refit latency over time, one panel per site and model, against the budget line."""
    _save(latency_over_time_figure(histories), path)


# ---------------------------------------------------------------- latency per transport

def latency_figure(runs: list[RunData], budget_s: float | None = None):
    series = []  # (label, transport, seconds, predicted_s, lower_bound_s)
    for run in runs:
        for t in style.transport_order(run.transports):
            fig_t = run.transports[t]
            vals = [v for v in ((fig_t.get("refit_s") or {}).get("all") or []) if isinstance(v, (int, float))]
            if vals:
                series.append((t if len(runs) == 1 else f"{run.label}\n{t}", t, vals, fig_t.get("predicted_s"),
                               fig_t.get("lower_bound_s")))
    values = [v for s in series for v in s[2]] + [v for s in series for v in s[3:] if isinstance(v, (int, float))]
    if budget_s is not None:
        values.append(budget_s)
    unit, scale = time_unit(values)
    fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 4.6), layout="constrained")
    kinds: set[str] = set()
    if series:
        bp = ax.boxplot([[v / scale for v in s[2]] for s in series], showmeans=True, patch_artist=True, widths=0.5,
                        medianprops={"color": "black", "linewidth": 1.5},
                        meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black",
                                   "markersize": 5})
        kinds |= {"mean", "median", "timed refit"}
        for i, (box, s) in enumerate(zip(bp["boxes"], series), start=1):
            c = style.transport_color(s[1])
            box.set_facecolor(c)
            box.set_alpha(0.35)
            jitter = np.linspace(-0.12, 0.12, len(s[2])) if len(s[2]) > 1 else [0.0]
            ax.scatter([i + j for j in jitter], [v / scale for v in s[2]], s=14, color=c, zorder=3, gid="timed refit")
            for kind, v, ls in (("predicted", s[3], "--"), ("lower bound", s[4], ":")):
                if isinstance(v, (int, float)):
                    kinds.add(kind)
                    ax.hlines(v / scale, i - 0.38, i + 0.38, colors="#333333", linestyles=ls, linewidth=1.6, gid=kind,
                              zorder=4)
        ax.set_xticks(range(1, len(series) + 1), [s[0] for s in series], fontsize=8)
        _y_scale(ax, [v / scale for v in values])
    else:
        ax.text(0.5, 0.5, "no timed refits", ha="center", va="center", transform=ax.transAxes)
    if budget_s is not None:
        kinds.add("budget")
        _budget_line(ax, budget_s, scale, unit)
    ax.set_ylabel(f"refit time per iteration ({unit})")
    ax.set_title("refit latency per transport (slowest rank: transfer + verify + commit)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles = _legend_handles(sorted(kinds), style.transport_order(s[1] for s in series), patches=True)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)), fontsize=8, frameon=False)
    return fig


def latency(runs: list[RunData], path: Path, budget_s: float | None = None) -> None:
    _save(latency_figure(runs, budget_s), path)


# ---------------------------------------------------------------- phase timeline

def _busiest(run: RunData, ranks: list[tuple[int, str]]) -> list[tuple[int, str]]:
    if len(ranks) <= style.MAX_RANK_ROWS:
        return ranks
    load: dict[int, float] = {}
    for s in run.segments:
        if style.is_refit_phase(s.phase):
            load[s.rank] = load.get(s.rank, 0.0) + s.duration
    keep = sorted(ranks, key=lambda r: (-load.get(r[0], 0.0), r[0]))[:style.MAX_RANK_ROWS]
    return sorted(keep)


def _refit_windows(segs) -> list[dict]:
    """One window per (transport, step): its start and end (seconds since the run's first event), warm-up or not."""
    w: dict[tuple[str, int | None], dict] = {}
    for s in segs:
        d = w.setdefault((s.transport, s.step), {"transport": s.transport, "step": s.step, "start": s.start,
                                                 "end": s.start + s.duration, "warmup": False})
        d["start"] = min(d["start"], s.start)
        d["end"] = max(d["end"], s.start + s.duration)
        d["warmup"] = d["warmup"] or s.warmup
    return sorted(w.values(), key=lambda d: d["start"])


def _compressor(windows: list[dict]):
    """``x(t)`` for the refit axis: the time between refits cut to at most ``cap``; the cuts' positions."""
    merged: list[list[float]] = []
    for d in windows:
        if merged and d["start"] <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], d["end"])
        else:
            merged.append([d["start"], d["end"]])
    cap = 0.25 * statistics.median([b - a for a, b in merged]) if merged else 0.0
    starts, new_starts, cuts = [], [], []
    pos = 0.0
    for i, (a, b) in enumerate(merged):
        if i:
            gap = a - merged[i - 1][1]
            if gap > cap:
                cuts.append(pos + cap / 2)
            pos += min(gap, cap)
        starts.append(a)
        new_starts.append(pos)
        pos += b - a

    def x(t: float) -> float:
        i = max(0, bisect.bisect_right(starts, t) - 1)
        return new_starts[i] + (t - starts[i]) if starts else t
    return x, cuts, cap, pos


def timeline_figure(run: RunData):
    segs = [s for s in run.segments if s.phase not in style.ENVELOPE_PHASES]
    refit = [s for s in segs if style.is_refit_phase(s.phase)]
    setup = [s for s in segs if not style.is_refit_phase(s.phase)]
    sides: dict[int, str] = {}
    for r, side in run.ranks():  # one row per rank (its side from any event that names one)
        sides[r] = sides.get(r) or side
    all_ranks = sorted(sides.items())
    ranks = _busiest(run, all_ranks)
    row = {r: i for i, (r, _) in enumerate(ranks)}
    n = max(1, len(ranks))
    fig, (ax_s, ax_r) = plt.subplots(1, 2, sharey=True, width_ratios=[1, 3], layout="constrained",
                                     figsize=(style.WIDTH_IN, 2.2 + 0.26 * n))
    height = 0.8
    # set-up: its own axis and unit, so a long materialise does not squeeze the refits
    s_unit, s_scale = time_unit([s.start + s.duration for s in setup] or [0.0])
    for s in setup:
        if s.rank in row:
            ax_s.broken_barh([(s.start / s_scale, max(s.duration / s_scale, 1e-4))], (row[s.rank] - height / 2, height),
                             facecolors=style.phase_color(s.phase), edgecolor="red" if s.error else "none",
                             gid="setup")
    ax_s.set_title("set-up (before and between refits)", fontsize=9)
    ax_s.set_xlabel(f"since the run's first event ({s_unit})", fontsize=8)
    if not setup:
        ax_s.text(0.5, 0.5, "no set-up events", ha="center", va="center", transform=ax_s.transAxes, fontsize=8)
    # refits: the time between them cut, warm-ups shaded, steps and transports labelled
    windows = _refit_windows(refit)
    x, cuts, cap, span = _compressor(windows)
    r_unit, r_scale = time_unit([span] if windows else [0.0])
    thinnest = span / r_scale / 2000 if span else 1e-4  # a phase too short to see still shows
    for s in refit:
        if s.rank in row:
            ax_r.broken_barh([(x(s.start) / r_scale, max(s.duration / r_scale, thinnest))],
                             (row[s.rank] - height / 2, height), facecolors=style.phase_color(s.phase),
                             edgecolor="red" if s.error else "none", linewidth=1.0, gid="refit")
    every = max(1, -(-len(windows) // 30))
    shown_transport: set[str] = set()
    for k, d in enumerate(windows):
        x0, x1 = x(d["start"]) / r_scale, x(d["end"]) / r_scale
        if d["warmup"]:
            ax_r.axvspan(x0, x1, facecolor="#cccccc", alpha=0.5, hatch="//", edgecolor="#999999", linewidth=0,
                         zorder=0, gid="warmup")
            wide = span > 0 and (d["end"] - d["start"]) / span > 0.06
            ax_r.text((x0 + x1) / 2, n - 0.1, "warm-up" if wide else "w", ha="center", va="bottom", fontsize=6.5,
                      color="#555555", gid="warmup-label")
        elif d["step"] is not None and k % every == 0:
            ax_r.text((x0 + x1) / 2, n - 0.1, f"s{d['step']}", ha="center", va="bottom", fontsize=6.5,
                      color="#333333", gid="step")
        if d["transport"] not in shown_transport:
            shown_transport.add(d["transport"])
            ax_r.text(x0, n + 0.45, d["transport"], ha="left", va="bottom", fontsize=8, fontweight="bold",
                      color=style.transport_color(d["transport"]))
    for c in cuts:
        ax_r.axvline(c / r_scale, color="#888888", linestyle=(0, (2, 2)), linewidth=0.8, gid="cut")
    ax_r.set_title("refits", fontsize=9)
    cut_note = f"; {len(cuts)} gaps between refits cut to {cap / r_scale:.3g} {r_unit} (dashed)" if cuts else ""
    ax_r.set_xlabel(f"refit time ({r_unit}{cut_note})", fontsize=8)
    if not windows:
        ax_r.text(0.5, 0.5, "no refit events", ha="center", va="center", transform=ax_r.transAxes, fontsize=8)
    for ax in (ax_s, ax_r):
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
    ax_s.set_yticks(range(len(ranks)), [f"rank {r} ({side})" for r, side in ranks], fontsize=7 if n <= 16 else 6)
    ax_s.set_ylim(-0.6, n + 1.1)
    dropped = len(all_ranks) - len(ranks)
    note = f" (the {len(ranks)} busiest of {len(all_ranks)} ranks)" if dropped else ""
    fig.suptitle(f"phases per rank: {run.label}{note}", fontsize=10)
    phases = style.phase_order({s.phase for s in segs})
    handles = [Patch(facecolor=style.phase_color(p), label=p) for p in phases]
    if any(d["warmup"] for d in windows):
        handles.append(Patch(facecolor="#cccccc", hatch="//", edgecolor="#999999", label="warm-up refit"))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(7, len(handles)), fontsize=7, frameon=False)
    return fig


def timeline(run: RunData, path: Path) -> None:
    _save(timeline_figure(run), path)


# ---------------------------------------------------------------- bytes per rank

def bytes_figure(run: RunData):
    data = run.bytes_per_rank()
    order = style.transport_order(data)
    all_ranks = sorted({r for t in order for r in data[t]})
    ranks = all_ranks
    if len(ranks) > style.MAX_RANK_ROWS:
        top = {r: max(data[t].get(r, 0) for t in order) for r in ranks}
        ranks = sorted(sorted(ranks, key=lambda r: (-top[r], r))[:style.MAX_RANK_ROWS])
    unit, scale = byte_unit([v for t in order for r, v in data[t].items() if r in ranks])
    fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 4.2), layout="constrained")
    width = 0.8 / max(1, len(order))
    for i, t in enumerate(order):
        xs = [k + (i - (len(order) - 1) / 2) * width for k in range(len(ranks))]
        ax.bar(xs, [data[t].get(r, 0) / scale for r in ranks], width=width, label=t, color=style.transport_color(t))
    if ranks:
        ax.set_xticks(range(len(ranks)), [str(r) for r in ranks], fontsize=8 if len(ranks) <= 16 else 6)
        fig.legend(loc="outside lower center", ncol=len(order), fontsize=8, frameon=False)  # off the bars
    else:
        ax.text(0.5, 0.5, "no transfer events", ha="center", va="center", transform=ax.transAxes)
    ax.yaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel("global rank (trainer ranks first)")
    ax.set_ylabel(f"{unit} per refit (transfer phases)")
    note = f" (the {len(ranks)} busiest of {len(all_ranks)} ranks)" if len(ranks) < len(all_ranks) else ""
    ax.set_title(f"bytes per rank: {run.label}{note}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return fig


def bytes_per_rank(run: RunData, path: Path) -> None:
    _save(bytes_figure(run), path)
