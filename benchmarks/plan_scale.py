"""Planner scale: planning time and peak memory vs model size and rank count (DGX H100 layouts).

Each case runs in a fresh subprocess (clean peak-RSS high-water mark). Prints one row per case and
how planning time grows with tensors x ranks, measured side by side in this one run.

    .venv/bin/python benchmarks/plan_scale.py            # all cases
    .venv/bin/python benchmarks/plan_scale.py --quick    # the smallest case of each model
    .venv/bin/python benchmarks/plan_scale.py --command  # also the whole `reshardctl plan --transport all`
                                                         # command per case: wall time and peak memory
    .venv/bin/python benchmarks/plan_scale.py --goal --base /tmp/base --repeat 5
        # only the goal case (and --compare-infer x 3), alternating with the source tree /tmp/base
        # (`git archive <commit> | tar -x -C /tmp/base`), 5 times each: medians side by side
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    # (model, trainer layout (Megatron), inference layout (vLLM))
    ("llama-3.1-70b", "tp=8,pp=8", "tp=8,dp=8"),  # 64 + 64
    ("llama-3.1-70b", "tp=8,pp=4,dp=8", "tp=8,dp=32"),  # 256 + 256
    ("llama-3.1-70b", "tp=8,pp=8,dp=8", "tp=8,dp=64"),  # 512 + 512
    ("qwen3-235b-a22b", "tp=4,pp=2,ep=8,etp=1,dp=8", "tp=8,dp=8"),  # 64 + 64
    ("qwen3-235b-a22b", "tp=4,pp=2,ep=16,etp=1,dp=32", "tp=8,dp=32"),  # 256 + 256
    ("deepseek-v3", "pp=16,ep=4,first=3,last=2", "tp=8,dp=8"),  # 64 + 64
    ("deepseek-v3", "pp=16,ep=16,first=3,last=2", "tp=32,dp=8"),  # 256 + 256 (the case)
    ("deepseek-v3", "pp=16,ep=32,dp=32,first=3,last=2", "tp=32,dp=16"),  # 512 + 512
]
QUICK = {0, 3, 5}

CHILD = r"""
import json, resource, sys, time
from reshardctl.layout.build import build_layout
from reshardctl.models import load_model
from reshardctl.plan.cost import Links, predict
from reshardctl.plan.lower_bound import lower_bound
from reshardctl.plan.planner import build_plan
from reshardctl.plan.stats import p2p_stats
from reshardctl.site import load_profile
from reshardctl.topology import Topology

model_name, train_spec, infer_spec = sys.argv[1:4]
site = load_profile("dgx-h100")
model = load_model(model_name)
train = build_layout(model, "train", train_spec)
infer = build_layout(model, "infer", infer_spec)
topo = Topology(train.world_size, infer.world_size, site.gpus_per_node, site.nvlink_domain_nodes)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
plan = build_plan(model, train, infer, topo, transport="reshard", bucket_bytes=site.refit.bucket_bytes, relay=True)
t1 = time.perf_counter()
links = Links.from_site(site)
stats = p2p_stats(plan)
pred = predict(plan, links, stats)
lb = lower_bound(plan, links)
t2 = time.perf_counter()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "tensors": len(model.tensors), "train": train.world_size, "infer": infer.world_size,
    "plan_s": t1 - t0, "cost_s": t2 - t1, "rss_before_mb": rss0 / 1024, "rss_peak_mb": rss1 / 1024,
    "units": len(plan.units), "rounds": len(plan.rounds), "transfers": plan.num_transfers,
    "predicted_s": pred.predicted_s, "lower_bound_s": lb.seconds,
}))
"""


# runs the CLI of another source tree (--base) with this interpreter: the editable install's finder
# (which would import this checkout) is dropped first
OTHER_TREE = r"""
import sys
src = sys.argv[1]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, src)
sys.argv = ["reshardctl", *sys.argv[2:]]
import reshardctl
assert reshardctl.__file__.startswith(src), reshardctl.__file__
from reshardctl.cli import main
main()
"""


def whole_command(model: str, train: str, infer: str, extra: tuple[str, ...] = (),
                  tree: str | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one `reshardctl plan --transport
    all` process, start to exit; ``tree``: run that source tree's CLI instead of this checkout's."""
    args = ["plan", "--site", "dgx-h100", "--model", model, "--train", train, "--infer", infer,
            "--transport", "all", "--json", *extra]
    argv = ([sys.executable, "-c", OTHER_TREE, str(Path(tree).absolute()), *args] if tree
            else [str(Path(sys.executable).parent / "reshardctl"), *args])
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def goal_side_by_side(base: str | None, repeat: int) -> None:
    """The goal case, plain and with --compare-infer x 3, this checkout alternating with ``base``:
    medians of ``repeat`` runs each (wall, CPU, peak RSS), every run listed."""
    model, tr, inf = CASES[6]
    cands = ("tp=32,dp=8", "tp=16,dp=16", "tp=64,dp=4")
    variants = (("plan --transport all", ()),
                ("+ --compare-infer x 3", tuple(x for c in cands for x in ("--compare-infer", c))))
    trees = (("base", base), ("this", None)) if base else (("this", None),)
    print(f"whole command: reshardctl plan --site dgx-h100 --model {model} --train {tr} --infer {inf} "
          f"--transport all --json; {repeat} runs each, alternating; goals: < 2 s (1 s), < 1 GiB; compare < 5 s")
    for label, extra in variants:
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in trees}
        for _ in range(repeat):
            for name, tree in trees:
                runs[name].append(whole_command(model, tr, inf, extra, tree))
        for name, _ in trees:
            walls, cpus, rss = zip(*runs[name])
            print(f"  {label:<24} {name:<5} wall median {statistics.median(walls):6.2f} s  CPU median "
                  f"{statistics.median(cpus):6.2f} s  peak {max(rss):5.0f} MiB   walls "
                  + " ".join(f"{w:.2f}" for w in walls) + "   CPUs " + " ".join(f"{c:.2f}" for c in cpus))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--command", action="store_true", help="also time the whole `reshardctl plan` command")
    ap.add_argument("--goal", action="store_true", help="only the goal case's whole command (see --base, --repeat)")
    ap.add_argument("--base", metavar="DIR", help="with --goal: a source tree to run alternately with this one")
    ap.add_argument("--repeat", type=int, default=3, help="with --goal: runs of each command (default 3)")
    args = ap.parse_args()
    if args.goal:
        goal_side_by_side(args.base, args.repeat)
        return
    rows = []
    print(f"{'model':<16} {'trainer':<32} {'inference':<30} {'tensors':>7} {'ranks':>9} {'plan s':>7} "
          f"{'stats+cost s':>12} {'peak MB':>8} {'+MB':>6} {'rounds':>6} {'transfers':>10} {'pred s':>7} {'LB s':>6}")
    for i, (model, tr, inf) in enumerate(CASES):
        if args.quick and i not in QUICK:
            continue
        out = subprocess.run([sys.executable, "-c", CHILD, model, tr, inf], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{model} {tr} -> {inf}: FAILED\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r.update(model=model, train_spec=tr, infer_spec=inf)
        rows.append(r)
        print(f"{model:<16} {tr:<32} {inf:<30} {r['tensors']:>7} {r['train']:>4}+{r['infer']:<4} {r['plan_s']:>7.2f} "
              f"{r['cost_s']:>12.2f} {r['rss_peak_mb']:>8.0f} {r['rss_peak_mb'] - r['rss_before_mb']:>6.0f} "
              f"{r['rounds']:>6} {r['transfers']:>10} {r['predicted_s']:>7.3f} {r['lower_bound_s']:>6.3f}")
    if args.command:
        print("\nwhole command: reshardctl plan --site dgx-h100 --transport all --json (goal for the DeepSeek-V3 "
              "256+256 case: < 2 s, < 1 GiB)")
        for i, (model, tr, inf) in enumerate(CASES):
            if args.quick and i not in QUICK:
                continue
            wall, cpu, mib = whole_command(model, tr, inf)
            print(f"  {model:<16} {tr:<32} {inf:<14} wall {wall:6.2f} s  CPU {cpu:6.2f} s  peak {mib:6.0f} MiB")
        model, tr, inf = CASES[6]
        cands = ("tp=32,dp=8", "tp=16,dp=16", "tp=64,dp=4")
        wall, cpu, mib = whole_command(model, tr, inf, tuple(x for c in cands for x in ("--compare-infer", c)))
        print(f"  {model:<16} {tr:<32} --compare-infer {len(cands)} candidates: wall {wall:6.2f} s  CPU {cpu:6.2f} s  "
              f"peak {mib:6.0f} MiB (goal < 5 s)")
    if len(rows) > 1:
        base = min(rows, key=lambda r: r["tensors"] * (r["train"] + r["infer"]))
        print("\ngrowth vs the smallest case (tensors x ranks, planning time):")
        for r in rows:
            work = r["tensors"] * (r["train"] + r["infer"]) / (base["tensors"] * (base["train"] + base["infer"]))
            print(f"  {r['model']:<16} {r['train']:>4}+{r['infer']:<4} work x{work:7.1f}   time x{r['plan_s'] / base['plan_s']:6.1f}")


if __name__ == "__main__":
    main()
