"""Turn the ranks' reports of one transport into the figures a runbook quotes (``summary.json``).

A rank's refit time is, by definition, the sum of its three phases, measured back to back from the
common start (a barrier): ``transfer`` (the bytes moving, to this rank's last step finished), ``verify``
(checksums, coverage, the full check if asked, the verdict vote) and ``commit`` (the swap to the new
weights). ``per_rank`` keeps every rank's phases and their sum. Per iteration a refit lasts as long as its
slowest rank: ``refit_s`` is the maximum over ranks of that sum, and ``transfer_s``/``verify_s``/
``commit_s`` the maximum of each phase alone (possibly different ranks, so these three need not add up
to ``refit_s``); each carries ``slowest_rank``, the rank that had that maximum per iteration.
``critical_phases_s`` splits each refit along its critical path instead, so the three add up to
``refit_s``: ``transfer`` until the last rank's transfer ended, ``verify`` from then until the last
rank's verify phase ended, ``commit`` the rest (medians over iterations). A rank whose transfer ends
early waits for the others in its verify phase (the checksum exchange is collective): the phase maxima
count that wait as verify time, the critical path does not.
``wire_bytes_per_refit`` (median over iterations) is the sum over ranks of the bytes each rank posted
to send or to receive (padding and trailers included): a point-to-point message is counted twice, once
by its sender and once by its receiver. Effective GB/s = bytes the inference ranks end up holding /
refit seconds.

``prediction_warning`` is set when ``measured_vs_predicted`` (the median refit, i.e. the busiest rank's,
over the plan's predicted seconds) is outside ``PREDICTION_RANGE`` (0.5-2x). It names the cost term most
likely wrong, by a heuristic: the plan predicts each measured phase (``predicted_phases_s``: ``transfer``,
``verify``, ``commit``) as a sum of terms; for each term, the one factor by which it alone would have to
be off to best match the measured phases on the critical path (``critical_phases_s``) (least squares of
the misses in seconds) is found, and
the term whose corrected prediction misses least is named (ties: the larger term), with the profile key
that sets it (``TERM_KEYS``). A term that shows in two phases (checksums: staged blocks during the
transfer, the rest in the verify phase) is told apart from one that shows in one. A pointer to what to
check first (or to calibrate), not a proof: the message says "most likely".
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def _finite(x):
    """JSON has no NaN: a figure that could not be measured (a failed run) is null."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


PHASES = ("transfer_s", "verify_s", "commit_s")
PREDICTION_RANGE = (0.5, 2.0)  # measured/predicted outside it: a warning naming the term most likely wrong
TERM_KEYS = {  # the site-profile keys (docs/site-profiles.md) that set each term's figure
    "wire": "links.nic_gbits_per_s / links.nvlink_gbytes_per_s (and their *_efficiency)",
    "latency": "links.launch_us / links.nic_latency_us / links.nvlink_latency_us",
    "pack": "links.mem_gbytes_per_s",
    "checksum": "links.checksum_gbytes_per_s (default: on cpu_only sites this machine's checksum probe, "
                "`reshardctl selftest` shows it; else links.mem_gbytes_per_s / 4)",
    "sync": "links.nic_latency_us / links.nvlink_latency_us (calibrated: the control round)",
    "landing": "links.landing_us_per_param",
}


def _rank_value(it, phase: str) -> float:
    """One rank's seconds in ``phase`` of one refit; ``refit_s`` is by definition the sum of its phases."""
    if phase == "refit_s":
        return it.transfer_s + it.verify_s + it.commit_s
    return getattr(it, phase)


def _critical(it_of_ranks) -> tuple[float, float, float]:
    """One refit's (transfer, verify, commit) along its critical path, from every rank's phases measured
    back to back from the common start: they add up to the refit (the slowest rank's sum)."""
    transfer = max(it.transfer_s for it in it_of_ranks)
    verified = max(it.transfer_s + it.verify_s for it in it_of_ranks)
    refit = max(_rank_value(it, "refit_s") for it in it_of_ranks)
    return transfer, verified - transfer, refit - verified


def _stats(values: list[float], slowest_rank: list[int]) -> dict[str, Any]:
    """median, p90, min and all (per iteration the slowest rank's value) and which rank that was."""
    return {"median": statistics.median(values) if values else float("nan"), "p90": _pct(values, 0.9),
            "min": min(values, default=float("nan")), "all": values, "slowest_rank": slowest_rank}


def summarize_transport(name: str, reports: Sequence, *, bytes_needed: int, predicted_s: float | None = None,
                        lower_bound_s: float | None = None, bucket_bytes: int | None = None,
                        fingerprint: str = "", predicted_breakdown_s: dict | None = None,
                        predicted_phases_s: dict | None = None) -> dict[str, Any]:
    """Figures of one transport from the RankReports of every rank (any order)."""
    failures = [
        {"rank": r.global_rank, "side": r.side, "side_rank": r.side_rank, "error": r.error_type, "message": r.error_message}
        for r in reports if not r.ok
    ]
    n_iter = min((len(r.iterations) for r in reports), default=0)
    ranks = sorted(reports, key=lambda r: r.global_rank)
    per_rank = {str(r.global_rank): {ph: [] for ph in PHASES + ("refit_s",)} for r in ranks}
    series: dict[str, list[float]] = {ph: [] for ph in PHASES + ("refit_s",)}
    slowest: dict[str, list[int]] = {ph: [] for ph in PHASES + ("refit_s",)}
    committed = n_iter > 0
    critical = [_critical([r.iterations[k] for r in ranks]) for k in range(n_iter)]
    for k in range(n_iter):
        for ph in PHASES + ("refit_s",):
            vals = [(_rank_value(r.iterations[k], ph), r.global_rank) for r in ranks]
            for v, g in vals:
                per_rank[str(g)][ph].append(v)
            v, g = max(vals, key=lambda x: (x[0], -x[1]))
            series[ph].append(v)
            slowest[ph].append(g)
        committed = committed and all(r.iterations[k].committed for r in ranks)
    refit, transfer = series["refit_s"], series["transfer_s"]
    wire = [sum(i.wire_bytes for i in (r.iterations[k] for r in reports)) for k in range(n_iter)]
    base_s = max((r.baseline.get("seconds", 0.0) for r in reports if r.baseline), default=None)
    med = statistics.median(refit) if refit else float("nan")
    med_t = statistics.median(transfer) if transfer else float("nan")
    out: dict[str, Any] = {
        "transport": name,
        "fingerprint": fingerprint,
        "iterations": n_iter,
        **{ph: _stats(series[ph], slowest[ph]) for ph in ("refit_s",) + PHASES},
        "critical_phases_s": {ph: statistics.median(c[i] for c in critical) if critical else float("nan")
                              for i, ph in enumerate(("transfer", "verify", "commit"))},
        "per_rank": per_rank,
        "bytes_needed": int(bytes_needed),
        "wire_bytes_per_refit": int(statistics.median(wire)) if wire else 0,
        "effective_gbps": (bytes_needed / med / 1e9) if refit and med > 0 else 0.0,
        "verified": bool(committed and not failures),
        "failures": failures,
        "committed_steps": {str(r.global_rank): r.committed_step for r in reports if r.side == "infer"},
        "committed_steps_agree": len({r.committed_step for r in reports if r.side == "infer"}) <= 1,
        "attempts": list(next((r.attempts for r in sorted(reports, key=lambda r: r.global_rank) if r.attempts), ())),
        "peak_staging_bytes": max((r.peak_staging_bytes for r in reports), default=0),
        "staged_weight_bytes": max((r.staged_weight_bytes for r in reports), default=0),
        "bucket_bytes": bucket_bytes,
        "predicted_s": predicted_s,
        "predicted_breakdown_s": predicted_breakdown_s,
        "predicted_phases_s": predicted_phases_s,  # the breakdown by measured phase (plan/cost.py Prediction.phases)
        # measured median refit / predicted: 1 is a perfect prediction, > 1 the refit was slower
        "measured_vs_predicted": (med / predicted_s) if predicted_s and refit else None,
        "lower_bound_s": lower_bound_s,
    }
    out["prediction_warning"] = prediction_warning(_finite(out))
    if base_s:
        out["raw_baseline_s"] = base_s
        out["transfer_vs_raw"] = base_s / med_t if med_t and med_t > 0 else None
    return _finite(out)


def _ms(x: float) -> str:
    return f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def _misfit(term: str, phases: dict[str, tuple[float, dict]]) -> tuple[float, float]:
    """(squared miss left, over the refit's seconds squared; factor) when ``term`` alone is scaled to match
    the measured phases (``{phase: (measured_s, {term: predicted_s})}``). Misses count in seconds: a phase
    the refit spends little time in (a verify phase whose checksums overlapped another rank's transfer)
    does not outweigh the one it spends most in."""
    num = den = 0.0
    for measured, terms in phases.values():
        a, gap = terms.get(term, 0.0), measured - sum(terms.values())
        num, den = num + a * gap, den + a * a
    x = max(-1.0, num / den) if den > 0 else 0.0  # the term's seconds are (1 + x) times the predicted
    refit = sum(measured for measured, _ in phases.values())
    miss = sum((measured - sum(terms.values()) - terms.get(term, 0.0) * x) ** 2
               for measured, terms in phases.values()) / refit ** 2
    return miss, 1.0 + x


FIT_SLACK = 1e-3  # fits whose squared miss is within this (about 3 % of the refit) of the best all explain it


def _likeliest(fits: dict[str, tuple[float, float]]) -> str:
    """The term most likely off, from ``{term: (miss, factor)}``: among the terms that explain the
    phases about as well as the best one (``FIT_SLACK``), the one that needs the smallest correction
    (``|log factor|``). A term of a millisecond scaled 10,000x can fit one phase exactly; a checksum
    rate 90x off that fits it nearly as well is the likelier cause (issue 35: a verify phase of 15.8 s
    was blamed on the sync term, predicted 1.3 ms, rather than on a checksum kernel 40x slower than the
    default figure)."""
    best = min(miss for miss, _ in fits.values())
    near = [t for t, (miss, _) in fits.items() if miss <= best + FIT_SLACK]
    return min(near, key=lambda t: (abs(math.log(max(fits[t][1], 1e-9))), fits[t][0]))


def prediction_warning(s: dict[str, Any]) -> dict[str, Any] | None:
    """The warning of one transport's figures (``summarize_transport``'s) when measured/predicted is outside
    ``PREDICTION_RANGE``: ``{"measured_vs_predicted", "term", "term_s", "factor", "profile_key",
    "message"}`` (``factor``: how far off the term looks, measured over predicted); None when within range
    or nothing to compare."""
    ratio, br = s.get("measured_vs_predicted"), s.get("predicted_breakdown_s") or {}
    lo, hi = PREDICTION_RANGE
    if ratio is None or lo <= ratio <= hi or not br:
        return None
    split = s.get("predicted_phases_s") or {"refit": br}  # older session records: the refit as one phase
    critical = s.get("critical_phases_s") or {}  # older records: the phase maxima
    phases = {}
    for ph, terms in split.items():
        measured = critical.get(ph, (s.get(f"{ph}_s") or {}).get("median"))
        if isinstance(measured, (int, float)) and measured > 0:
            phases[ph] = (float(measured), terms)
    if not phases:
        return None
    fits = {t: _misfit(t, phases) for t in br if t in TERM_KEYS and br[t] > 0}
    if not fits:
        return None
    term = _likeliest(fits)
    factor = fits[term][1]
    message = (f"{s['transport']}: measured/predicted {ratio:.2f}, outside {lo:g}-{hi:g}x ("
               + ", ".join(f"{ph} {_ms(m)} vs {_ms(sum(t.values()))} predicted" for ph, (m, t) in phases.items())
               + f"); most likely the `{term}` term is off: {_ms(br[term])} predicted, the phases fit best with "
               f"{factor:.3g}x that; its figure is set by {TERM_KEYS[term]} (or `reshardctl calibrate` measures it)")
    return {"measured_vs_predicted": ratio, "term": term, "term_s": br[term], "factor": factor,
            "profile_key": TERM_KEYS[term], "message": message}


def speedups(summaries: dict[str, dict], reference: str = "reshard") -> dict[str, float]:
    """Median refit time of every transport divided by the reference's (> 1: the reference is faster)."""
    ref = summaries.get(reference)
    if not ref or not ref["refit_s"]["all"]:
        return {}
    r = ref["refit_s"]["median"]
    return {t: s["refit_s"]["median"] / r for t, s in summaries.items() if s["refit_s"]["all"] and r}
