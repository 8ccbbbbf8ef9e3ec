"""How local ranks start: fork server (torch imported once) versus spawn (each rank imports it), on the
whole `reshardctl run` command, side by side in one run.

Each round runs the same `reshardctl run` twice, once per start method (``RESHARDCTL_START_METHOD``),
alternating which goes first, and reads from the run directory:

* ``wall``: the whole command, as the user waits for it (process start to exit);
* ``set-up``: from the launcher's start (``run.json`` ``started_at``) to the end of the last rank's
  ``materialise`` phase (the busiest rank: every rank started, imported, rendezvoused and built its
  weights);
* ``cpu``: user + system CPU seconds of the command and every process it waited for (spawned ranks are
  its children; with the fork server the ranks are the server's children and the server is not waited
  for, so this column counts the launcher only there: compare ``wall`` and ``set-up``).

Prints the medians and the ratios spawn / fork server. Timings on a loaded machine are noisy; the
rounds alternate so both methods see the same load.

    .venv/bin/python benchmarks/rank_start.py [--rounds 3] [--train tp=2,dp=2] [--infer tp=2,dp=2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("forkserver", "spawn")


def set_up_s(run_dir: Path) -> float:
    started = json.loads((run_dir / "run.json").read_text())["started_at"]
    ends = []
    for f in sorted((run_dir / "events").glob("rank-*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("phase") == "materialise":
                ends.append(e["start"] + e["duration_s"])
                break
    if not ends:
        raise SystemExit(f"{run_dir}: no rank reached materialise")
    return max(ends) - started


def one(method: str, args, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "reshardctl", "run", "--model", args.model, "--train", args.train,
            "--infer", args.infer, "--iters", str(args.iters), "--warmup", "1", "--out", str(out), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env={**os.environ, "RESHARDCTL_START_METHOD": method}, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{method}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "set-up": set_up_s(out), "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--train", default="tp=2,dp=2")
    ap.add_argument("--infer", default="tp=2,dp=2")
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = ap.parse_args()
    got: dict[str, list[dict]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory(prefix="reshardctl-rank-start-") as tmp:
        for i in range(args.rounds):
            for m in (METHODS if i % 2 == 0 else METHODS[::-1]):
                got[m].append(one(m, args, Path(tmp) / f"{m}-{i}"))
                print(f"round {i + 1} {m:>10}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got[m][-1].items()),
                      flush=True)
    med = {m: {k: statistics.median(r[k] for r in got[m]) for k in ("wall", "set-up", "cpu")} for m in METHODS}
    print(f"\n`reshardctl run --model {args.model} --train {args.train} --infer {args.infer}`, "
          f"{args.rounds} rounds, medians:")
    print(f"{'':>12} {'wall s':>8} {'set-up s':>9} {'cpu s':>8}")
    for m in METHODS:
        print(f"{m:>12} {med[m]['wall']:8.2f} {med[m]['set-up']:9.2f} {med[m]['cpu']:8.2f}")
    print(f"{'spawn/fork':>12} {med['spawn']['wall'] / med['forkserver']['wall']:7.2f}x "
          f"{med['spawn']['set-up'] / med['forkserver']['set-up']:8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": got, "medians": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()
