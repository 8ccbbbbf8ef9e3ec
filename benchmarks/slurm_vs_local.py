"""The same refit through the Slurm launcher and the local launcher, side by side, whole command.

Runs `reshardctl bench` (reshard and gather-and-broadcast on the same ranks) twice per round, once with
`--launcher slurm` (het job on the local test cluster: `tests/slurm/cluster-up.sh`) and once with the
local launcher, alternating, and prints per launcher: the command's wall time split into queue (submit
-> running), start-up (the rest of command start -> every rank's process groups ready: inputs, plans,
job start, interpreters, rendezvous) and the rest (weights, refits, exit); and the refit medians.
Both use the slurm-local profile's links and the same model and layouts, so the refit figures compare the
launchers, not the links.

    .venv/bin/python benchmarks/slurm_vs_local.py [--rounds 2] [--iters 5] [--mode hetjob|two-jobs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["--model", "tiny-llama", "--train", "tp=2", "--infer", "tp=2"]


def _ready_at(run_dir: Path) -> float:
    """When the last rank had its process groups (unix time, from the events)."""
    ends = [e["start"] + e["duration_s"] for f in (run_dir / "events").glob("rank-*.jsonl")
            for e in map(json.loads, f.read_text().splitlines()) if e["phase"] == "group_init"]
    return max(ends)


def _bench(launcher: str, iters: int, mode: str, out: Path) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "reshardctl", "bench", "--site", "slurm-local", *ARGS, "--iters", str(iters),
           "--launcher", launcher, "--out", str(out), "--json"]
    if launcher == "slurm":
        cmd += ["--slurm-mode", mode]
    t0, start = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    s = json.loads(proc.stdout)
    sl = s.setdefault("slurm", {})
    if launcher == "local":  # no queue: start-up is command start -> every rank's process groups ready
        sl["queue_s"], sl["startup_s"] = 0.0, _ready_at(out) - start
    else:  # the command's own time before submitting (inputs, plans, run directory) counts as start-up too
        sl["startup_s"] = _ready_at(out) - start - sl["queue_s"]
    return wall, s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--mode", default="hetjob", choices=("hetjob", "two-jobs"))
    a = ap.parse_args()
    rows: dict[str, list] = {"slurm": [], "local": []}
    with tempfile.TemporaryDirectory() as d:
        for k in range(a.rounds):
            for launcher in ("slurm", "local"):
                wall, s = _bench(launcher, a.iters, a.mode, Path(d) / f"{launcher}-{k}")
                rows[launcher].append((wall, s))
    med = statistics.median
    print(f"tiny-llama, Megatron tp=2 -> vLLM tp=2 (4 ranks), `reshardctl bench`, {a.iters} refits per transport, "
          f"{a.rounds} rounds per launcher (alternating); medians over rounds")
    print(f"{'launcher':16s} {'wall':>8s} {'queue':>8s} {'start-up':>9s} {'rest':>8s} "
          f"{'reshard':>9s} {'gather_bc':>10s} {'ratio':>6s}")
    for launcher, rs in rows.items():
        wall = med(w for w, _ in rs)
        sl = [s.get("slurm", {}) for _, s in rs]
        q = med(x["queue_s"] for x in sl)
        up = med(x["startup_s"] for x in sl)
        r = med(s["transports"]["reshard"]["refit_s"]["median"] for _, s in rs)
        g = med(s["transports"]["gather_broadcast"]["refit_s"]["median"] for _, s in rs)
        name = f"slurm ({a.mode})" if launcher == "slurm" else "local"
        rest = wall - q - up
        print(f"{name:16s} {wall:7.2f}s {q:7.2f}s {up:8.2f}s {rest:7.2f}s {r * 1e3:7.1f}ms {g * 1e3:8.1f}ms "
              f"{g / r:5.2f}x")
    ws, wl = med(w for w, _ in rows["slurm"]), med(w for w, _ in rows["local"])
    rs_ = med(s["transports"]["reshard"]["refit_s"]["median"] for _, s in rows["slurm"])
    rl = med(s["transports"]["reshard"]["refit_s"]["median"] for _, s in rows["local"])
    print(f"slurm / local: whole command {ws / wl:.2f}x, reshard refit median {rs_ / rl:.2f}x")


if __name__ == "__main__":
    main()
