"""Checksum rate on the CPU, single-threaded, side by side in one process (the machine is shared:
compare only within a run): the int8 row sums (the CPU's path) vs the float64 row sums (CUDA's path and
the CPU's fallback), and with ``--base`` an earlier ``checksum.py`` (e.g. the float64 code with a matmul
per 64-limb block, before commit "checksums in int8 matmuls"), loaded from that file. The two current
paths must give the same values (the base defines its random weights differently: timed only).

    .venv/bin/python benchmarks/checksum_rate.py [--repeats 3] [--base DIR/reshardctl/runtime/checksum.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from unittest import mock

import torch

from reshardctl.runtime import checksum as current


def packed(count: int, size: int) -> tuple[list[int], list[int], int]:
    """``count`` regions of ``size`` bytes, each at the next 8-byte aligned offset (as staging lays them)."""
    stride = (size + 7) & ~7
    return [k * stride for k in range(count)], [size] * count, count * stride


CASES = [("64 MiB, one segment", [0], [64 << 20], 64 << 20),
         ("200 x 140 KB regions", *packed(200, 140_000)),
         ("5,000 x 1 KB regions", *packed(5000, 1000))]


def best_of(repeats: int, fn) -> tuple[float, torch.Tensor]:
    fn()  # weight tables built outside the timing
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def on_path(int8: bool):
    return mock.patch.dict(current._int8_ok, {("cpu", -1): int8})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per implementation")
    ap.add_argument("--base", help="an earlier checksum.py to time beside the current one")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = None
    if args.base:
        spec = importlib.util.spec_from_file_location("base_checksum", args.base)
        base = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(base)
    if not current._use_int8(torch.device("cpu")):
        raise SystemExit("this torch has no working torch._int_mm: the CPU uses the float64 path only")
    print(f"{'case':24s} {'base s':>9s} {'float64 s':>10s} {'int8 s':>9s} {'float64/int8':>13s} {'base/int8':>10s}")
    for name, offsets, sizes, total in CASES:
        buf = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        with on_path(True):
            fast_t, fast = best_of(args.repeats, lambda: current.segment_checksums(buf, offsets, sizes))
        with on_path(False):
            slow_t, slow = best_of(args.repeats, lambda: current.segment_checksums(buf, offsets, sizes))
        if not torch.equal(fast, slow):
            raise SystemExit(f"{name}: the int8 and float64 paths disagree")
        base_t = best_of(args.repeats, lambda: base.segment_checksums(buf, offsets, sizes))[0] if base else float("nan")
        print(f"{name:24s} {base_t:9.4f} {slow_t:10.4f} {fast_t:9.4f} {slow_t / fast_t:12.2f}x {base_t / fast_t:9.2f}x")


if __name__ == "__main__":
    main()
