"""Rank set-up at cluster scale: one rank's program built from the shipped plan, in a fresh process.

For each case the parent builds the plan once and pickles it (as ``session.pkl`` ships it to the
ranks); then, for the busiest trainer rank and the busiest inference rank (most regions), a fresh
process loads the pickle and compiles ONLY that rank's program (runtime/program.py), measuring the
compile time and its peak memory (tracemalloc: what the program build allocates, on top of the loaded
plan), and, separately, the pickle load. Also counted from the program: host work per refit on that
rank (p2p messages posted, broadcasts, checksum-exchange messages, regions).
Side by side at 64 + 64, 256 + 256 and 512 + 512: the per-rank cost must not grow with the world.

    .venv/bin/python benchmarks/rank_setup.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

CASES = [
    ("deepseek-v3", "pp=16,ep=4,first=3,last=2", "tp=8,dp=8"),  # 64 + 64
    ("deepseek-v3", "pp=16,ep=16,first=3,last=2", "tp=32,dp=8"),  # 256 + 256 (the case)
    ("deepseek-v3", "pp=16,ep=32,dp=32,first=3,last=2", "tp=32,dp=16"),  # 512 + 512
]

CHILD = r"""
import json, pickle, sys, time, tracemalloc
path, rank = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
with open(path, "rb") as f:
    plan = pickle.load(f)
load_s = time.perf_counter() - t0
from reshardctl.runtime.program import compile_program
tracemalloc.start()
t1 = time.perf_counter()
prog = compile_program(plan, rank)
seconds = time.perf_counter() - t1
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
t2 = time.perf_counter()
compile_program(plan, rank)  # again, untraced: tracemalloc slows allocation-heavy code
untraced = time.perf_counter() - t2
# per refit, from the program and this rank's arena layout (no tensors): messages in place or staged,
# regions copied through staging, checksum passes (one per staging block per step and direction, plus
# the arena's in the verify phase)
from types import SimpleNamespace
from reshardctl.runtime.arena import arena_offsets
from reshardctl.runtime.span_copy import copy_spec
from reshardctl.runtime.wire import place
offsets, _ = arena_offsets(plan.model, prog.holdings, prog.order)
layout = SimpleNamespace(model=plan.model, boxes=prog.holdings, box_offset=offsets, arena=True)
in_place = staged = copied = passes = 0
for st in prog.steps:
    for links in (st.sends, st.recvs):
        step_staged = False
        for x in links:
            for m in x.messages:
                if place(plan.model, prog.holdings, offsets, m.regions, m.offsets) is None:
                    staged += 1
                    # copy kernels (span_copy.py): one indexed copy, or one strided copy per run of
                    # alike regions, else one copy per region
                    spec = copy_spec(layout, m.regions, m.offsets)
                    copied += spec.calls if spec is not None else len(m.regions)
                    step_staged = True
                else:
                    in_place += 1
        passes += step_staged
passes += 1 if in_place else 0
ops = dict(prog.counts, in_place_messages=in_place, staged_messages=staged, copied_regions=copied,
           checksum_passes=passes)
print(json.dumps({"load_s": load_s, "seconds": min(seconds, untraced), "traced_s": seconds,
                  "peak_mib": peak / 2**20, "ops": ops,
                  "peers": len(set(prog.out_messages) | set(prog.in_messages))}))
"""


def busiest(plan, side: str) -> int:
    """The rank of ``side`` with the most regions to send or receive (ties: the lowest), counted
    over the plan's transfer tables at once (numpy), not rank by rank."""
    import numpy as np

    world = plan.train_world + plan.infer_world
    n = np.zeros(world, dtype=np.int64)
    for rnd in plan.rounds:
        for e in rnd.records():
            tab = plan.units[e.unit].table
            inst = e.inst_hi - e.inst_lo
            n += inst * np.bincount(tab.src[e.t_lo : e.t_hi], minlength=world)[:world]
            n += inst * np.bincount(tab.dst[e.t_lo : e.t_hi], minlength=world)[:world]
    lo, hi = (0, plan.train_world) if side == "train" else (plan.train_world, world)
    return lo + int(np.argmax(n[lo:hi]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the 256 + 256 case")
    ap.add_argument("--transport", default="reshard")
    ap.add_argument("--json", help="write the cases to this file")
    args = ap.parse_args()
    from reshardctl.layout.build import build_layout
    from reshardctl.models import load_model
    from reshardctl.plan.planner import build_plan
    from reshardctl.site import load_profile
    from reshardctl.topology import Topology

    site = load_profile("dgx-h100")
    rows = []
    cases = CASES[1:2] if args.quick else CASES
    with tempfile.TemporaryDirectory() as tmp:
        for model_name, train_spec, infer_spec in cases:
            model = load_model(model_name)
            train = build_layout(model, "train", train_spec)
            infer = build_layout(model, "infer", infer_spec)
            topo = Topology(train.world_size, infer.world_size, site.gpus_per_node, site.nvlink_domain_nodes)
            plan = build_plan(model, train, infer, topo, transport=args.transport,
                              bucket_bytes=site.refit.bucket_bytes, relay=True)
            path = os.path.join(tmp, "plan.pkl")
            with open(path, "wb") as f:
                pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
            ranks = f"{train.world_size} + {infer.world_size}"
            for side in ("train", "infer"):
                rank = busiest(plan, side)
                out = subprocess.run([sys.executable, "-c", CHILD, path, str(rank)], check=True,
                                     capture_output=True, text=True)
                got = json.loads(out.stdout)
                rows.append({"model": model_name, "train": train_spec, "infer": infer_spec, "ranks": ranks,
                             "side": side, "rank": rank, **got})
                print(f"{ranks:>10}  {side:5} rank {rank:4}: program {got['seconds']:.2f} s, peak "
                      f"{got['peak_mib']:.0f} MiB (plan load {got['load_s']:.2f} s); per refit: "
                      f"{got['ops']['p2p_messages']} p2p messages + {got['ops']['broadcasts']} broadcasts in "
                      f"{got['ops']['steps']} steps ({got['ops']['in_place_messages']} in place, "
                      f"{got['ops']['staged_messages']} staged: {got['ops']['copied_regions']} copy calls), "
                      f"{got['ops']['checksum_passes']} checksum passes, {got['ops']['checksum_messages']} "
                      f"checksum-exchange messages; {got['ops']['regions']} regions, {got['peers']} peers",
                      flush=True)
    worst = max(rows, key=lambda r: r["seconds"])
    print(f"\nworst program build: {worst['seconds']:.2f} s ({worst['ranks']}, {worst['side']} rank "
          f"{worst['rank']}), goal < 1 s; worst peak {max(r['peak_mib'] for r in rows):.0f} MiB, goal < 256 MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
