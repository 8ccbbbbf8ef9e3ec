"""Checksum rate of every CPU path, side by side in one process, beside a ``copy_`` of the same bytes.

Each path (runtime/checksum_rows.py: ``c-avx2``, ``c-base``, ``int8``, ``float64``; those this machine
and install have) computes ``segment_checksums`` of the same buffers, with the threads given (default
one: a rank's, where ranks share the cores), in rounds across the paths so that a load that comes and
goes hits them alike; best of ``--repeats``. Every path must give the same values (else exit 1). Prints
GB/s per path and case, the copy rate, each path's share of it, which path ``checksum_choice`` picks
here, and the CPU (``lscpu`` model name, torch's CPU capability).

    .venv/bin/python benchmarks/checksum_rate.py [--repeats 5] [--threads 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from unittest import mock

import torch

from reshardctl.runtime import checksum as checksum_module
from reshardctl.runtime import checksum_choice, checksum_rows


def packed(count: int, size: int) -> tuple[list[int], list[int], int]:
    """``count`` regions of ``size`` bytes, each at the next 8-byte aligned offset (as staging lays them)."""
    stride = (size + 7) & ~7
    return [k * stride for k in range(count)], [size] * count, count * stride


CASES = [("64 MiB, one segment", [0], [64 << 20], 64 << 20),
         ("200 x 140 KB regions", *packed(200, 140_000)),
         ("5,000 x 1 KB regions", *packed(5000, 1000))]


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="best of this many rounds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a rank's)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = checksum_rows.paths(torch.device("cpu"))
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}; "
          f"threads {args.threads}; paths here: {', '.join(paths)}")
    result = {"cpu": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
              "threads": args.threads, "cases": {}}
    head = f"{'case':24s} {'copy_ GB/s':>10s} " + " ".join(f"{p + ' GB/s':>13s}" for p in paths)
    print(head + "   " + " ".join(f"{p + '/copy':>12s}" for p in paths))
    for name, offsets, sizes, total in CASES:
        buf = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        dst = torch.empty_like(buf)
        best = {p: float("inf") for p in paths}
        best_copy = float("inf")
        out = {}
        for p in paths:  # tables built, untimed
            out[p] = checksum_module._checksums(buf, offsets, sizes, p)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            dst.copy_(buf)
            best_copy = min(best_copy, time.perf_counter() - t0)
            for p in paths:
                t0 = time.perf_counter()
                out[p] = checksum_module._checksums(buf, offsets, sizes, p)
                best[p] = min(best[p], time.perf_counter() - t0)
        for p in paths:
            if not torch.equal(out[p], out["float64"]):
                raise SystemExit(f"{name}: the {p} and float64 paths disagree")
        nbytes = sum(sizes)
        copy = total / best_copy
        rates = {p: nbytes / best[p] for p in paths}
        print(f"{name:24s} {copy / 1e9:10.2f} " + " ".join(f"{rates[p] / 1e9:13.3f}" for p in paths) + "   "
              + " ".join(f"{rates[p] / copy:12.3f}" for p in paths))
        result["cases"][name] = {"copy_bytes_per_s": copy, "bytes_per_s": rates}
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict("os.environ", {"XDG_CACHE_HOME": cache}):
        checksum_choice.forget()
        c = checksum_choice.choice()  # measured afresh, in a cache of its own: what a rank here would take
    print(c.line())
    result["choice"] = {"path": c.path, "rates": c.rates, "copy_rate": c.copy_rate}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
