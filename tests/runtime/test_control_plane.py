"""The control plane's all-reduce (runtime/groups.py ``tree_all_reduce``): on real gloo ranks, every
world size from 1 to 9 (powers of two and not), MIN and SUM, every rank ends with the elementwise
result, and every step's wait is the caller's (so the runtime bounds each one)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from reshardctl.runtime.control_tree import tree_all_reduce
from helpers.spawned_ranks import run_ranks

WORLD = 9


def _rank(rank: int, port: int, q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    out = {}
    for m in range(1, WORLD + 1):
        group = dist.new_group(list(range(m)))  # collective: every rank creates every group
        if rank >= m:
            continue
        waits = []

        def wait(works, waits=waits):
            waits.append(len(works))
            for w in works:
                w.wait()
        # slot r holds rank r's value, the others a neutral element: MIN gathers every rank's value
        v = torch.full((m, 3), 1 << 40, dtype=torch.int64)
        v[rank] = torch.tensor([rank, 10 * rank + 7, -rank])
        tree_all_reduce(v, torch.minimum, rank=rank, world=m, group=group, wait=wait)
        s = torch.tensor([rank + 1, 1], dtype=torch.int64)
        tree_all_reduce(s, torch.add, rank=rank, world=m, group=group, wait=wait)
        out[m] = (v.tolist(), s.tolist(), waits)
    q.put((rank, out, None))
    dist.destroy_process_group()


def test_tree_all_reduce_gives_every_rank_the_result_at_every_world_size():
    got = run_ranks(_rank, WORLD, lambda r, port, q: (r, port, q))
    for m in range(1, WORLD + 1):
        want_v = [[r, 10 * r + 7, -r] for r in range(m)]
        want_s = [m * (m + 1) // 2, m]
        levels = (m - 1).bit_length()  # ceil(log2 m)
        for r in range(m):
            v, s, waits = got[r][m]
            assert v == want_v and s == want_s, (m, r)
            # one message per step, every one waited; per all-reduce at most 2 ceil(log2 m) steps
            assert all(n == 1 for n in waits) and len(waits) <= 2 * 2 * levels, (m, r, waits)
        # m - 1 messages up and m - 1 down per all-reduce, each waited at both ends: a tree, no extra hop
        assert sum(len(got[r][m][2]) for r in range(m)) == 2 * 2 * 2 * (m - 1), m
