"""The report plots' fixed look: one colour per transport, per phase and per runbook decision, the legend
orders, and the figure size, so every plot (and every report) draws the same thing the same way.

Colours are fixed by name, never taken in colormap order of what a run happens to contain: ``verify`` is
the same green in a run of one transport and in a bench of three. A phase this table does not know gets a
grey picked from its name (stable across runs).
"""

from __future__ import annotations

import zlib

# figure width 9.6 in at 100 dpi: 960 px, readable on a laptop without scaling
DPI = 100
WIDTH_IN = 9.6
MAX_RANK_ROWS = 32  # past this many ranks, the per-rank plots show the busiest ones and say so

TRANSPORT_ORDER = ("reshard", "hybrid", "gather_broadcast")
TRANSPORT_COLORS = {"reshard": "#1f77b4", "hybrid": "#9467bd", "gather_broadcast": "#ff7f0e"}
OTHER_TRANSPORT_COLOR = "#7f7f7f"

# set-up: before (or between) the refits; refit: the phases of one refit, in legend order
SETUP_PHASES = ("rendezvous", "group_init", "connect", "materialise/open", "program", "materialise", "baseline",
                "agreement", "settle")
REFIT_PHASES = ("round/pack", "round/transfer", "round/unpack", "bucket/gather", "bucket/broadcast", "bucket/unpack",
                "verify", "verify/full", "commit", "decide", "repair", "rollback")
ENVELOPE_PHASES = ("attempt",)  # spans a whole refit: not a bar of its own
PHASE_COLORS = {
    "rendezvous": "#c7c7c7", "group_init": "#9edae5", "connect": "#17becf", "materialise/open": "#dbdb8d",
    "program": "#bcbd22", "materialise": "#8c564b", "baseline": "#c49c94", "agreement": "#f7b6d2",
    "settle": "#e377c2",
    "round/pack": "#aec7e8", "round/transfer": "#1f77b4", "round/unpack": "#98df8a",
    "bucket/gather": "#ffbb78", "bucket/broadcast": "#ff7f0e", "bucket/unpack": "#2ca02c",
    "verify": "#9467bd", "verify/full": "#c5b0d5", "commit": "#000000", "decide": "#7f7f7f",
    "repair": "#ff9896", "rollback": "#d62728",
}
_UNKNOWN_GREYS = ("#555555", "#777777", "#999999", "#bbbbbb")

# runbook decisions on the latency-over-time plot
MARK_COLORS = {"promote": "#2ca02c", "rollback": "#e377c2", "declined": "#a0a0a0"}
DECLINED_VERDICTS = ("refused", "verify_failed")
BUDGET_COLOR = "#d62728"

# the legend of the latency plots, always in this order (transports first, in TRANSPORT_ORDER)
LEGEND_ORDER = ("timed refit", "warm-up refit", "failed refit", "mean", "median", "predicted", "lower bound", "budget",
                "promote", "rollback", "refused / verify failed")


def transport_order(names) -> list[str]:
    names = list(dict.fromkeys(names))
    return [t for t in TRANSPORT_ORDER if t in names] + sorted(t for t in names if t not in TRANSPORT_ORDER)


def transport_color(name: str) -> str:
    return TRANSPORT_COLORS.get(name, OTHER_TRANSPORT_COLOR)


def phase_order(names) -> list[str]:
    names = set(names)
    known = [p for p in SETUP_PHASES + REFIT_PHASES if p in names]
    return known + sorted(names - set(known))


def phase_color(name: str) -> str:
    if name in PHASE_COLORS:
        return PHASE_COLORS[name]
    return _UNKNOWN_GREYS[zlib.crc32(name.encode()) % len(_UNKNOWN_GREYS)]


def is_refit_phase(name: str) -> bool:
    """A phase inside one refit (``round/*``, ``bucket/*``, verify, commit ...); anything else but the
    ``attempt`` envelope is set-up."""
    return name in REFIT_PHASES or name.startswith(("round/", "bucket/"))


def mark_kind(action: str, verdict: str) -> str:
    """``promote`` | ``rollback`` | ``declined`` (a refused promote, a rollback whose verify failed)."""
    if verdict in DECLINED_VERDICTS:
        return "declined"
    return "rollback" if action == "rollback" else "promote"
