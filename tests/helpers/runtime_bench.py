"""Refit benchmark on this machine, real planner plans, every transport in ONE session (same processes):

    python tests/helpers/runtime_bench.py [--bucket-mb N] [--iterations N] [--case NAME ...]

Cases: tiny-llama Megatron tp=4 -> vLLM tp=4, tiny-qwen3-moe Megatron ep=4 -> vLLM tp=4, tiny-llama
Megatron tp=2,pp=2 -> vLLM tp=2,dp=2. Per transport: median transfer time (max over ranks, per refit),
verify (checksums + compare + vote) and commit, the raw transfer of the same per-pair byte volumes
(best of 3, ``RankReport.baseline``), and the peak staging memory per side against the bucket size.
``--hand`` runs the older hand-made 4-matrix plan instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package

from reshardctl.launch.local import launch_local_ranks  # noqa: E402
from reshardctl.runtime.contract import RunOptions  # noqa: E402

CASES = {
    "llama-tp4": ("tiny-llama", "tp=4", "tp=4"),
    "qwen3moe-ep4": ("tiny-qwen3-moe", "ep=4", "tp=4"),
    "llama-tp2pp2": ("tiny-llama", "tp=2,pp=2", "tp=2,dp=2"),
}
TRANSPORTS = ("reshard", "gather_broadcast", "hybrid")


def planner_plan(model: str, train: str, infer: str, transport: str, bucket_mb: int | None):
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare
    from reshardctl.plan.planner import build_plan

    inp = prepare(RefitRequest(model=model, train=train, infer=infer, transport=transport, bucket_mb=bucket_mb))
    return build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=transport,
                      bucket_bytes=inp.bucket_bytes, relay=inp.relay)


def summarise(title: str, plans: dict, out: dict) -> None:
    first = next(iter(plans.values()))
    print(f"== {title}: {first.model.num_bytes / 1e6:.0f} MB, {first.train_world} -> {first.infer_world} ranks, "
          f"bucket {first.bucket_bytes / 2**20:.0f} MiB")
    med = {}
    for name, reps in out.items():
        n = len(reps[0].iterations)
        per = [max(r.iterations[k].transfer_s for r in reps) for k in range(n)]
        ver = [max(r.iterations[k].verify_s for r in reps) for k in range(n)]
        com = [max(r.iterations[k].commit_s for r in reps) for k in range(n)]
        med[name] = statistics.median(per)
        raw = max(r.baseline.get("seconds", 0.0) for r in reps)
        peak = {s: max(r.peak_staging_bytes for r in reps if r.side == s) / 2**20 for s in ("train", "infer")}
        print(f"  {name:17s} transfer {med[name] * 1e3:7.1f} ms (min {min(per) * 1e3:6.1f})  verify "
              f"{statistics.median(ver) * 1e3:6.1f} ms  commit {statistics.median(com) * 1e3:4.1f} ms  raw same bytes "
              f"{raw * 1e3:6.1f} ms  raw/transfer {raw / med[name] if med[name] else 0:4.2f}  peak staging "
              f"train {peak['train']:6.1f} / infer {peak['infer']:6.1f} MiB")
    if "reshard" in med:
        print("  " + "  ".join(f"{k}/reshard {v / med['reshard']:.2f}x" for k, v in med.items() if k != "reshard"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bucket-mb", type=int, default=None)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--hand", action="store_true", help="the hand-made 256 MB 4-matrix plan instead")
    a = ap.parse_args()
    opts = RunOptions(run_dir=None, iterations=a.iterations, timeout_s=300, baseline=True)
    if a.hand:
        from helpers.runtime_plans import big_case, bucket_plan, p2p_plan

        m, src, dst = big_case(256, 4, 4)
        plans = {"reshard": p2p_plan(m, src, dst),
                 "gather_broadcast": bucket_plan(m, src, dst, [[k] for k in range(len(m.tensors))])}
        summarise("hand-made 4 matrices", plans, launch_local_ranks(plans, opts, warmup=1))
        return
    for key in a.case or list(CASES):
        model, train, infer = CASES[key]
        plans = {t: planner_plan(model, train, infer, t, a.bucket_mb) for t in TRANSPORTS}
        summarise(f"{model} megatron {train} -> vllm {infer}", plans, launch_local_ranks(plans, opts, warmup=1))


if __name__ == "__main__":
    main()
