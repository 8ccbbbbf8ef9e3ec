"""Turn the ranks' reports of one transport into the figures a runbook quotes (``summary.json``).

Per iteration, a refit lasts as long as its slowest rank: ``refit_s = max over ranks of
(transfer + verify + commit)`` measured from the common start; ``transfer_s`` is the same maximum of the
transfer phase alone (the bytes moving), ``verify_s`` the cost of verification (checksums, coverage,
the verdict vote). Effective GB/s = bytes the inference ranks end up holding / refit seconds.
"""

from __future__ import annotations

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


def summarize_transport(name: str, reports: Sequence, *, bytes_needed: int, predicted_s: float | None = None,
                        lower_bound_s: float | None = None, bucket_bytes: int | None = None,
                        fingerprint: str = "", predicted_breakdown_s: dict | None = None) -> dict[str, Any]:
    """Figures of one transport from the RankReports of every rank (any order)."""
    failures = [
        {"rank": r.global_rank, "side": r.side, "side_rank": r.side_rank, "error": r.error_type, "message": r.error_message}
        for r in reports if not r.ok
    ]
    n_iter = min((len(r.iterations) for r in reports), default=0)
    refit, transfer, verify, commit = [], [], [], []
    committed = n_iter > 0
    for k in range(n_iter):
        its = [r.iterations[k] for r in reports]
        refit.append(max(i.transfer_s + i.verify_s + i.commit_s for i in its))
        transfer.append(max(i.transfer_s for i in its))
        verify.append(max(i.verify_s for i in its))
        commit.append(max(i.commit_s for i in its))
        committed = committed and all(i.committed for i in its)
    wire = [sum(i.wire_bytes for i in (r.iterations[k] for r in reports)) for k in range(n_iter)]
    base_s = max((r.baseline.get("seconds", 0.0) for r in reports if r.baseline), default=None)
    med = statistics.median(refit) if refit else float("nan")
    med_t = statistics.median(transfer) if transfer else float("nan")
    out: dict[str, Any] = {
        "transport": name,
        "fingerprint": fingerprint,
        "iterations": n_iter,
        "refit_s": {"median": med, "p90": _pct(refit, 0.9), "min": min(refit, default=float("nan")), "all": refit},
        "transfer_s": {"median": med_t, "p90": _pct(transfer, 0.9), "all": transfer},
        "verify_s": {"median": statistics.median(verify) if verify else float("nan"), "all": verify},
        "commit_s": {"median": statistics.median(commit) if commit else float("nan")},
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
        # measured median refit / predicted: 1 is a perfect prediction, > 1 the refit was slower
        "measured_vs_predicted": (med / predicted_s) if predicted_s and refit else None,
        "lower_bound_s": lower_bound_s,
    }
    if base_s:
        out["raw_baseline_s"] = base_s
        out["transfer_vs_raw"] = base_s / med_t if med_t and med_t > 0 else None
    return _finite(out)


def speedups(summaries: dict[str, dict], reference: str = "reshard") -> dict[str, float]:
    """Median refit time of every transport divided by the reference's (> 1: the reference is faster)."""
    ref = summaries.get(reference)
    if not ref or not ref["refit_s"]["all"]:
        return {}
    r = ref["refit_s"]["median"]
    return {t: s["refit_s"]["median"] / r for t, s in summaries.items() if s["refit_s"]["all"] and r}
