"""Refit benchmark on this machine: python tests/runtime_bench.py [MB] [T] [I]

Hand-made plan: 4 bf16 matrices, trainers hold row blocks, inference ranks column blocks (every
inference rank needs a piece from every trainer). Reports the refit time (max over ranks of the
transfer, best of the iterations after the first), and the raw send/recv of the same bytes in the same run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from runtime_plans import big_case, bucket_plan, p2p_plan  # noqa: E402

from reshardctl.launch.local import run_local  # noqa: E402
from reshardctl.runtime.contract import RunOptions  # noqa: E402


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    I = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    m, src, dst = big_case(mb, T, I)
    nbytes = m.num_bytes
    cases = [
        ("p2p, 1 round", p2p_plan(m, src, dst), dict(overlap=True)),
        ("p2p, 4 rounds, overlap", p2p_plan(m, src, dst, per_tensor_rounds=True, bucket_bytes=nbytes // 4), dict(overlap=True)),
        ("p2p, 4 rounds, no overlap", p2p_plan(m, src, dst, per_tensor_rounds=True, bucket_bytes=nbytes // 4), dict(overlap=False)),
        ("gather+broadcast, 4 buckets", bucket_plan(m, src, dst, [[k] for k in range(len(m.tensors))]), dict(overlap=True)),
    ]
    print(f"model {nbytes / 1e6:.0f} MB, {T} trainer -> {I} inference ranks (gloo, CPU)")
    for name, plan, kw in cases:
        with tempfile.TemporaryDirectory() as d:
            reps = run_local(plan, RunOptions(run_dir=d, iterations=4, timeout_s=120, baseline=True, **kw))
        per_it = [max(r.iterations[k].transfer_s for r in reps) for k in range(4)]
        verify = max(r.iterations[-1].verify_s for r in reps)
        best = min(per_it[1:])
        base = max(r.baseline.get("seconds", 0.0) for r in reps)
        peak = max(r.peak_staging_bytes for r in reps)
        print(f"{name:30s} refit {best * 1e3:7.1f} ms ({nbytes / best / 1e9:5.2f} GB/s)  iterations "
              f"{[round(x * 1e3) for x in per_it]} ms  verify+vote {verify * 1e3:5.1f} ms  "
              f"raw send/recv {base * 1e3:6.1f} ms ({nbytes / base / 1e9 if base else 0:5.2f} GB/s)  "
              f"peak staging {peak / 2**20:6.1f} MiB (bucket {plan.bucket_bytes / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
