"""The report's PNG plots (matplotlib, Agg backend: no display needed on a login node).

* ``latency``: per transport (and per run, when comparing), the distribution of the timed refits.
* ``timeline``: per rank, the phases of every refit on one time axis (one plot per run).
* ``bytes``: per rank, the bytes through its transfer phases in one refit, per transport (one per run).

Each function writes one PNG and returns nothing; figures are closed so a long report does not hold them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from reshardctl.report.collect import REFIT_PHASES, History, RunData  # noqa: E402

DPI = 110
TRANSPORT_ORDER = ("reshard", "hybrid", "gather_broadcast")


def _order(names) -> list[str]:
    names = list(names)
    return [t for t in TRANSPORT_ORDER if t in names] + [t for t in names if t not in TRANSPORT_ORDER]


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)


def latency(runs: list[RunData], path: Path, budget_s: float | None = None) -> None:
    series, labels = [], []
    for run in runs:
        for t in _order(run.transports):
            vals = [v * 1e3 for v in ((run.transports[t].get("refit_s") or {}).get("all") or []) if v is not None]
            if vals:
                series.append(vals)
                labels.append(t if len(runs) == 1 else f"{run.label}\n{t}")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(series) + 2), 4))
    if series:
        ax.boxplot(series, showmeans=True)
        for i, vals in enumerate(series, start=1):
            ax.scatter([i] * len(vals), vals, s=14, alpha=0.6, color="tab:blue", zorder=3)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    else:
        ax.text(0.5, 0.5, "no timed refits", ha="center", va="center", transform=ax.transAxes)
    if budget_s is not None:
        ax.axhline(budget_s * 1e3, color="tab:red", linestyle="--", label=f"budget {budget_s:g} s")
        ax.legend(fontsize=8)
    ax.set_ylabel("refit time per iteration (ms)")
    ax.set_title("refit latency per transport (slowest rank: transfer + verify + commit)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def timeline(run: RunData, path: Path) -> None:
    segs = [s for s in run.segments if s.phase in REFIT_PHASES]
    ranks = run.ranks()
    phases = [p for p in REFIT_PHASES if any(s.phase == p for s in segs)]
    cmap = plt.get_cmap("tab10")
    color = {p: cmap(i % 10) for i, p in enumerate(phases)}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * max(1, len(ranks))))
    row = {rank: i for i, (rank, _) in enumerate(ranks)}
    for s in segs:
        ax.broken_barh([(s.start, max(s.duration, 5e-5))], (row[s.rank] - 0.4, 0.8),
                       facecolors=color[s.phase], edgecolor="black" if s.error else "none")
    # transport spans: where each transport's refits ran
    for t in _order({s.transport for s in segs}):
        ts = [s for s in segs if s.transport == t]
        lo = min(s.start for s in ts)
        ax.axvline(lo, color="grey", linestyle=":", linewidth=0.8)
        ax.text(lo, len(ranks) - 0.45, f" {t}", fontsize=8, va="bottom", color="dimgrey")
    ax.set_yticks(range(len(ranks)), [f"rank {r} ({side})" for r, side in ranks], fontsize=8)
    ax.set_ylim(-0.6, len(ranks) + 0.2)
    ax.set_xlabel("seconds since the run's first event")
    ax.set_title(f"phases per rank and iteration: {run.label}")
    if phases:
        ax.legend(handles=[Patch(color=color[p], label=p) for p in phases], fontsize=7, ncol=min(5, len(phases)),
                  loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def bytes_per_rank(run: RunData, path: Path) -> None:
    data = run.bytes_per_rank()
    order = _order(data)
    ranks = sorted({r for t in order for r in data[t]})
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(ranks) * max(1, len(order)) + 2), 4))
    width = 0.8 / max(1, len(order))
    for i, t in enumerate(order):
        xs = [k + (i - (len(order) - 1) / 2) * width for k in range(len(ranks))]
        ax.bar(xs, [data[t].get(r, 0) / 2**10 for r in ranks], width=width, label=t)
    if ranks:
        ax.set_xticks(range(len(ranks)), [str(r) for r in ranks])
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no transfer events", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("global rank (trainer ranks first)")
    ax.set_ylabel("KiB per refit through transfer phases")
    ax.set_title(f"bytes per rank: {run.label}")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def latency_over_time(histories: list[History], path: Path) -> None:
    """Refit latency over time, one panel per site and model, against the budget line."""
    fig, axes = plt.subplots(max(1, len(histories)), 1, figsize=(9, 3.5 * max(1, len(histories))), squeeze=False)
    for ax, h in zip(axes[:, 0], histories or [None]):
        if h is None or not h.refits:
            ax.text(0.5, 0.5, "no refits", ha="center", va="center", transform=ax.transAxes)
            continue
        for t in _order({r.transport for r in h.refits}):
            rs = [r for r in h.refits if r.transport == t]
            ax.scatter([r.start_unix for r in rs], [r.seconds for r in rs], s=14, label=t)
        if h.budget_s is not None:
            ax.axhline(h.budget_s, color="tab:red", linestyle="--", label=f"budget {h.budget_s:g} s")
        ax.set_title(f"{h.site or '-'}: {h.model}", fontsize=10)
        ax.set_ylabel("refit latency (s)")
        ax.legend(fontsize=8)
    _save(fig, path)
