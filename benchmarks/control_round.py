"""One control-plane round, side by side on the same gloo ranks: gloo's own all-reduce (a ring of
2 (n - 1) steps) against the runtime's binomial tree (``runtime/groups.py`` ``tree_all_reduce``,
2 ceil(log2 n) steps), each run in a helper thread as the runtime runs it (``bounded_wait.run_bounded``). A refit runs
three such rounds (the common start, the vote, the acknowledgement). Medians over ``--reps`` rounds
after a barrier, slowest rank per round; world sizes as given.

    .venv/bin/python benchmarks/control_round.py [--worlds 4 8] [--reps 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reshardctl.calibrate.microbench import in_helper_thread
from reshardctl.launch.ports import free_port
from reshardctl.runtime.bounded_wait import wait_all
from reshardctl.runtime.control_tree import tree_all_reduce


def rank_main(rank: int, world: int, port: int, reps: int, q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    v = torch.zeros(world, dtype=torch.int64)
    ways = {"gloo ring": lambda: in_helper_thread(lambda: dist.all_reduce(v, op=dist.ReduceOp.MIN)),
            "tree": lambda: in_helper_thread(lambda: tree_all_reduce(v, torch.minimum, rank=rank, world=world,
                                                                     group=None, wait=wait_all))}
    out = {name: [] for name in ways}
    for i in range(reps + 3):  # alternating, so both see the same load; 3 warm-ups
        for name, fn in ways.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if i >= 3:
                out[name].append(time.perf_counter() - t0)
    q.put((rank, out))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print(f"{'ranks':>5s} {'gloo ring ms':>13s} {'tree ms':>8s} {'ring / tree':>12s}")
    for world in args.worlds:
        port = free_port()
        q = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, world, port, args.reps, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = dict(q.get() for _ in procs)
        for p in procs:
            p.join()
        med = {name: statistics.median(max(got[r][name][i] for r in range(world)) for i in range(args.reps))
               for name in ("gloo ring", "tree")}
        print(f"{world:5d} {med['gloo ring'] * 1e3:13.2f} {med['tree'] * 1e3:8.2f} "
              f"{med['gloo ring'] / med['tree']:11.2f}x")


if __name__ == "__main__":
    main()
