"""`make demo` (``reshardctl run``, no arguments) once per checksum path, side by side in one run: the
whole command as a user runs it, each in a fresh process with ``RESHARDCTL_CHECKSUM_PATH`` set (``auto``:
the path measured fastest here, what a user gets) and an empty checksum cache. Prints per path the
command's wall time, each transport's median refit, reshard's speedup over gather-and-broadcast, the
critical phases (transfer, verify: the busiest rank's) and measured/predicted.

``--avx2`` caps torch and oneDNN at AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``): on a
CPU with AVX-512 VNNI this stands in for one without it, as far as torch's kernels go (the int8 matmul
then runs without VNNI); the CPU itself is unchanged, so say so beside any figure it gives.

    .venv/bin/python benchmarks/demo_checksum_paths.py [--paths auto,int8,float64] [--avx2] [--iters 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(path: str, iters: int, avx2: bool, work: Path) -> dict:
    env = dict(os.environ, RESHARDCTL_CHECKSUM_PATH=path, XDG_CACHE_HOME=str(work / f"cache-{path}"),
               XDG_STATE_HOME=str(work / f"state-{path}"), COLUMNS="160")
    if avx2:
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    out = work / f"run-{path}"
    argv = [sys.executable, "-m", "reshardctl", "run", "--iters", str(iters), "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{path}: reshardctl run exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    chosen = next((line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                   if "checksum" in line and "measured on this machine" in line), "")
    return {"wall_s": wall, "summary": summary, "figures": summary.get("cost_figures", ""), "line": chosen}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="auto,int8,float64")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--avx2", action="store_true", help="cap torch/oneDNN at AVX2 (see above)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    res = {}
    with tempfile.TemporaryDirectory(prefix="reshardctl-demo-paths-") as tmp:
        for p in paths:
            res[p] = run_once(p, args.iters, args.avx2, Path(tmp))
    print(f"reshardctl run (the demo), {args.iters} refits per transport"
          + (", torch/oneDNN capped at AVX2" if args.avx2 else ""))
    print(f"{'path':8s} {'wall s':>7s} {'reshard':>9s} {'gather_b':>9s} {'speedup':>8s} {'rs transfer':>12s} "
          f"{'rs verify':>10s} {'verify/transfer':>16s} {'rs meas/pred':>13s} {'gb meas/pred':>13s}")
    for p, r in res.items():
        t = r["summary"]["transports"]
        rs, gb = t["reshard"], t["gather_broadcast"]
        crit = rs["critical_phases_s"]
        print(f"{p:8s} {r['wall_s']:7.1f} {rs['refit_s']['median']:9.3f} {gb['refit_s']['median']:9.3f} "
              f"{gb['refit_s']['median'] / rs['refit_s']['median']:7.2f}x {crit['transfer']:12.3f} "
              f"{crit['verify']:10.3f} {crit['verify'] / crit['transfer']:16.2f} "
              f"{rs['measured_vs_predicted'] or float('nan'):13.2f} {gb['measured_vs_predicted'] or float('nan'):13.2f}")
    for p, r in res.items():
        print(f"{p}: predicted from {r['figures']}")
    if args.json:
        Path(args.json).write_text(json.dumps({p: {"wall_s": r["wall_s"], "transports": r["summary"]["transports"],
                                                   "cost_figures": r["figures"]} for p, r in res.items()}, indent=1))


if __name__ == "__main__":
    main()
