"""Refit on this machine, side by side: reshard vs gather-and-broadcast vs hybrid, and the raw ceiling.

For each case, ONE session of 8 processes (4 trainer + 4 inference, gloo on CPU) runs every
transport on the same processes, then a raw gloo send/recv of the same per-pair byte volume (the
loopback ceiling). Prints medians and the ratios the issue asks for.

Before each case (unless ``--no-calibrate``) it calibrates the ``local`` site exactly as
``reshardctl calibrate --site local`` does, into a private state directory, so every prediction
printed uses this machine's figures measured right before the refits (the machine is shared: its load
moves within minutes); it ends with predicted / measured median refit per case and transport.

    .venv/bin/python benchmarks/refit_local.py [--iters 7] [--bucket-mb 64] [--no-calibrate]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.runs.session import run_refit_session

CASES = [
    ("dense tp4->tp4", "tiny-llama", "tp=4", "tp=4"),
    ("MoE ep4->tp4", "tiny-qwen3-moe", "ep=4", "tp=4"),
    ("dense tp2,pp2->tp2,dp2", "tiny-llama", "tp=2,pp=2", "tp=2,dp=2"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--json", help="also write all summaries to this file")
    ap.add_argument("--no-calibrate", action="store_true", help="predict from the figures the site already has")
    ap.add_argument("--reps", type=int, default=3, help="calibration repetitions per microbenchmark")
    args = ap.parse_args()
    rows = []
    state = tempfile.TemporaryDirectory()
    os.environ["XDG_STATE_HOME"] = state.name

    def calibrate() -> dict:
        """`reshardctl calibrate --site local`, into the private state directory (where plan finds it)."""
        from reshardctl.atomic_write import write_json_atomic
        from reshardctl.calibrate.runner import calibration, measure
        from reshardctl.site import load_profile
        from reshardctl.site.measured import default_path

        site = load_profile("local")
        cal = calibration(site, measure(site, reps=args.reps))
        default_path("local").parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(default_path("local"), cal, indent=2)
        print("calibration: " + ", ".join(f"{k} {v:.3g}" for k, v in cal["figures"].items()))
        return cal

    for label, model, train, infer in CASES:
        # the machine's load moves within minutes (it is shared): calibrate right before each case
        cal = None if args.no_calibrate else calibrate()
        inp = prepare(RefitRequest(model=model, train=train, infer=infer, bucket_mb=args.bucket_mb))
        with tempfile.TemporaryDirectory() as d:
            res = run_refit_session(inp, list(TRANSPORTS), iterations=args.iters, warmup=1, baseline=True, out=d)
        if not res.ok:
            print(f"{label}: FAILED: {res.error}")
            continue
        s = res.summary["transports"]
        r, g, h = s["reshard"], s["gather_broadcast"], s["hybrid"]
        rows.append({"case": label, "model": model, "train": train, "infer": infer, "summary": res.summary,
                     "calibration": cal})
        print(f"\n{label}: {model} ({inp.model.num_bytes / 2**20:.0f} MiB), Megatron {train} -> vLLM {infer}, "
              f"bucket {inp.bucket_bytes / 2**20:.0f} MiB, {args.iters} refits each")
        for name, x in (("reshard", r), ("gather_broadcast", g), ("hybrid", h)):
            print(f"  {name:17s} refit median {x['refit_s']['median'] * 1e3:7.1f} ms  p90 {x['refit_s']['p90'] * 1e3:7.1f} ms  "
                  f"transfer {x['transfer_s']['median'] * 1e3:7.1f} ms  verify {x['verify_s']['median'] * 1e3:6.1f} ms  "
                  f"peak staging {x['peak_staging_bytes'] / 2**20:6.1f} MiB  verified {x['verified']}")
        print(f"  gather_broadcast / reshard (median refit): {g['refit_s']['median'] / r['refit_s']['median']:.2f}x")
        print(f"  hybrid / reshard (median refit):           {h['refit_s']['median'] / r['refit_s']['median']:.2f}x")
        if r.get("raw_baseline_s"):
            print(f"  reshard transfer vs raw gloo send/recv of the same bytes: raw {r['raw_baseline_s'] * 1e3:.1f} ms "
                  f"-> reshard at {100 * r['transfer_vs_raw']:.0f} % of the ceiling")
        print(f"  peak staging / bucket: {r['peak_staging_bytes'] / inp.bucket_bytes:.2f} (reshard), "
              f"{g['peak_staging_bytes'] / inp.bucket_bytes:.2f} (gather_broadcast)")
    print("\npredicted / measured median refit (goal: within 25 %)")
    print(f"  {'case':26s} {'transport':17s} {'predicted':>10s} {'measured':>10s} {'meas/pred':>9s}  within 25 %")
    for row in rows:
        for name, x in row["summary"]["transports"].items():
            p, m = x["predicted_s"], x["refit_s"]["median"]
            print(f"  {row['case']:26s} {name:17s} {p * 1e3:8.1f}ms {m * 1e3:8.1f}ms {m / p:9.2f}  "
                  f"{'yes' if abs(m / p - 1) <= 0.25 else 'no'}   ({', '.join(f'{k} {v * 1e3:.1f}' for k, v in x['predicted_breakdown_s'].items())} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    state.cleanup()


if __name__ == "__main__":
    main()
