"""Planner scale: planning time and peak memory vs model size and rank count (DGX H100 layouts).

Each case runs in a fresh subprocess (clean peak-RSS high-water mark). Prints one row per case and
how planning time grows with tensors x ranks, measured side by side in this one run.

    .venv/bin/python benchmarks/plan_scale.py            # all cases
    .venv/bin/python benchmarks/plan_scale.py --quick    # the smallest case of each model
    .venv/bin/python benchmarks/plan_scale.py --command  # also the whole `reshardctl plan --transport all`
                                                         # command per case: wall time and peak memory
    .venv/bin/python benchmarks/plan_scale.py --goal --base /tmp/base --repeat 5
        # only the goal case, alternating with the source tree /tmp/base (`git archive <commit> | tar -x
        # -C /tmp/base`), 5 times each, best and median side by side: the import of reshardctl.cli alone,
        # the whole command (wall, CPU, peak RSS, its own planning_s), with --compare-infer x 3, and the
        # busiest trainer's and inference rank's program (compiled from the pickled plan in a fresh
        # process); the CPU model and the load average before and after. Both trees are byte-compiled
        # first (as an installed copy is); --source leaves them without bytecode
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


# the first lines of a child that imports another source tree (sys.argv[1]; "" for this checkout): the
# editable install's finder (which would import this checkout) is dropped first
TREE = r"""
import sys
src = sys.argv.pop(1)
if src:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, src)
    import reshardctl
    assert reshardctl.__file__.startswith(src), reshardctl.__file__
"""
# runs the CLI of another source tree (--base) with this interpreter
OTHER_TREE = TREE + r"""
sys.argv = ["reshardctl", *sys.argv[1:]]
from reshardctl.cli import main
main()
"""
# only what `reshardctl` imports before it parses the command line
IMPORT_ONLY = TREE + "import reshardctl.cli\n"
# the busiest trainer and inference rank (most regions) of the goal case's reshard plan, each rank's program
# compiled in a fresh process from the pickled plan, as a rank does from its session file (rank_setup.py)
PROGRAM = TREE + r"""
import json, os, pickle, subprocess, tempfile, time
import numpy as np
from reshardctl.layout.build import build_layout
from reshardctl.models import load_model
from reshardctl.plan.planner import build_plan
from reshardctl.site import load_profile
from reshardctl.topology import Topology
model_name, train_spec, infer_spec, child = sys.argv[1:5]
site = load_profile("dgx-h100")
model = load_model(model_name)
train, infer = build_layout(model, "train", train_spec), build_layout(model, "infer", infer_spec)
topo = Topology(train.world_size, infer.world_size, site.gpus_per_node, site.nvlink_domain_nodes)
plan = build_plan(model, train, infer, topo, transport="reshard", bucket_bytes=site.refit.bucket_bytes, relay=True)
n = np.zeros(plan.world, dtype=np.int64)  # regions per rank (entries as tuples or as an array: either tree)
for rnd in plan.rounds:
    for unit, lo, hi, t_lo, t_hi in np.asarray(rnd.entries, dtype=np.int64).reshape(-1, 5).tolist():
        tab = plan.units[unit].table
        n += (hi - lo) * (np.bincount(tab.src[t_lo:t_hi], minlength=plan.world)
                          + np.bincount(tab.dst[t_lo:t_hi], minlength=plan.world))[:plan.world]
T = plan.train_world
out = {}
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "plan.pkl")
    with open(path, "wb") as f:
        pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
    for side, rank in (("train", int(np.argmax(n[:T]))), ("infer", T + int(np.argmax(n[T:])))):
        got = subprocess.run([sys.executable, "-c", child, src, path, str(rank)], capture_output=True, text=True,
                             check=True)
        out[side] = {"rank": rank, **json.loads(got.stdout)}
print(json.dumps(out))
"""
RANK_PROGRAM = TREE + r"""
import json, pickle, time
path, rank = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
with open(path, "rb") as f:
    plan = pickle.load(f)
load_s = time.perf_counter() - t0
from reshardctl.runtime.program import compile_program
t1 = time.perf_counter()
compile_program(plan, rank)
print(json.dumps({"program_s": time.perf_counter() - t1, "load_s": load_s}))
"""


# this checkout, imported from its directory like a base tree (not through the editable install's finder,
# which costs an installed copy nothing and this one ~30 ms of import): the two trees start alike
THIS = str(Path(__file__).resolve().parent.parent)


def _tree_argv(script: str, tree: str | None, *args: str) -> list[str]:
    return [sys.executable, "-c", script, str(Path(tree).absolute()) if tree else THIS, *args]


def _timed(argv: list[str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds (user + system), peak RSS (MiB) and stdout of one process, start to exit."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:3])} ... failed: {p.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.decode()


def whole_command(model: str, train: str, infer: str, extra: tuple[str, ...] = (),
                  tree: str | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one `reshardctl plan --transport
    all` process, start to exit; ``tree``: run that source tree's CLI instead of this checkout's."""
    return goal_run(model, train, infer, extra, tree)[:3]


def goal_run(model: str, train: str, infer: str, extra: tuple[str, ...] = (),
             tree: str | None = None) -> tuple[float, float, float, float]:
    """``whole_command``'s figures and the command's own ``planning_s`` (its ``--json``)."""
    args = ["plan", "--site", "dgx-h100", "--model", model, "--train", train, "--infer", infer,
            "--transport", "all", "--json", *extra]
    wall, cpu, rss, out = _timed(_tree_argv(OTHER_TREE, tree, *args))
    return wall, cpu, rss, json.loads(out)["planning_s"]


def machine() -> str:
    """The CPU model, torch's CPU capability and the load average: what a figure was measured on."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    # in a child: torch here would raise this process's peak RSS, which its children's ru_maxrss inherit
    got = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True)
    cap = got.stdout.strip() if got.returncode == 0 else "no torch"
    return f"{model}, {os.cpu_count()} cores, torch CPU capability {cap}, load average " + \
        " ".join(f"{x:.2f}" for x in os.getloadavg())


def byte_compile(tree: str | None) -> None:
    """Write the bytecode of ``tree``'s package (``compileall``), as ``pip install`` does at install time: a
    tree without it (``PYTHONDONTWRITEBYTECODE=1``, as on the developers' machine) compiles every module
    from source in every run, about 0.1 s of the command that no installed copy pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree or THIS).absolute() / "reshardctl")],
                   check=True, stdout=subprocess.DEVNULL)


def goal_side_by_side(base: str | None, repeat: int, program: bool = True, source: bool = False) -> None:
    """The goal case, this checkout alternating with ``base``, ``repeat`` runs each: the import of
    ``reshardctl.cli`` alone, the whole ``plan --transport all`` command (wall, CPU, peak RSS, and its own
    ``planning_s``), the same with --compare-infer x 3, and (``program``) the busiest rank's program.
    Best of the runs (the machine is shared: the least disturbed run) and median, every run listed."""
    model, tr, inf = CASES[6]
    cands = ("tp=32,dp=8", "tp=16,dp=16", "tp=64,dp=4")
    compare = tuple(x for c in cands for x in ("--compare-infer", c))
    trees = (("base", base), ("this", None)) if base else (("this", None),)
    if not source:
        for _, tree in trees:
            byte_compile(tree)
    print(f"machine: {machine()}")
    print("modules: " + ("compiled from source in every run (--source)" if source else
                         "byte-compiled first in both trees (compileall), as an installed copy is"))
    print(f"whole command: reshardctl plan --site dgx-h100 --model {model} --train {tr} --infer {inf} "
          f"--transport all --json; {repeat} runs each, alternating; goals: < 1 s, rank program < 0.5 s")
    runs: dict[tuple[str, str], list[tuple]] = {}
    for _ in range(repeat):
        for name, tree in trees:
            runs.setdefault(("import reshardctl.cli", name), []).append(_timed(_tree_argv(IMPORT_ONLY, tree))[:3])
            runs.setdefault(("plan --transport all", name), []).append(goal_run(model, tr, inf, (), tree))
            runs.setdefault(("+ --compare-infer x 3", name), []).append(goal_run(model, tr, inf, compare, tree))
    for (label, name), rs in runs.items():
        cols = list(zip(*rs))
        line = (f"  {label:<22} {name:<5} wall best {min(cols[0]):5.2f} median {statistics.median(cols[0]):5.2f} s  "
                f"CPU best {min(cols[1]):5.2f} median {statistics.median(cols[1]):5.2f} s  peak {max(cols[2]):4.0f} MiB")
        if len(cols) > 3:
            line += f"  planning_s best {min(cols[3]):5.2f}"
        print(line + "   walls " + " ".join(f"{w:.2f}" for w in cols[0]))
    if program:
        for name, tree in trees:
            got = []
            for _ in range(max(1, min(repeat, 3))):
                got.append(json.loads(_timed(_tree_argv(PROGRAM, tree, model, tr, inf, RANK_PROGRAM))[3]))
            for side in ("train", "infer"):
                secs = [g[side]["program_s"] for g in got]
                print(f"  busiest {side} rank's program ({name}, rank {got[0][side]['rank']}): best {min(secs):.2f} s, "
                      f"median {statistics.median(secs):.2f} s (plan load {min(g[side]['load_s'] for g in got):.2f} s)"
                      "   runs " + " ".join(f"{x:.2f}" for x in secs))
    print(f"machine at the end: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--command", action="store_true", help="also time the whole `reshardctl plan` command")
    ap.add_argument("--goal", action="store_true", help="only the goal case's whole command (see --base, --repeat)")
    ap.add_argument("--base", metavar="DIR", help="with --goal: a source tree to run alternately with this one")
    ap.add_argument("--repeat", type=int, default=3, help="with --goal: runs of each command (default 3)")
    ap.add_argument("--no-program", action="store_true", help="with --goal: leave out the busiest rank's program")
    ap.add_argument("--source", action="store_true",
                    help="with --goal: leave the trees without bytecode (each run compiles them from source)")
    args = ap.parse_args()
    if args.goal:
        goal_side_by_side(args.base, args.repeat, program=not args.no_program, source=args.source)
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
