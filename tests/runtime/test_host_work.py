"""Host work per refit grows with a rank's messages, not with its tensors or regions.

Real gloo processes refit through ``api.Refitter`` (what an RL framework runs) a MoE model with 8 and
with 32 experts (four times the expert tensors and regions, the same messages); every rank counts the
torch operations that reach the dispatcher during one steady-state refit (on a GPU: its kernel
launches, copies and views) and the gc-tracked objects the refit leaves behind. Before the caller's
tensors were bound once (api.py ``_local``, the executor's piece views, the commit's one
``_foreach_copy_``), a trainer rank's operations grew 2.7x with the regions and an inference rank's
1.6x. Then every rank hands over new tensors: the old ones must be freed (no cached view keeps them)
and an inference rank's new tensors must receive the step. benchmarks/host_work.py prints the same
counts with Python calls and lines.
"""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from reshardctl import api
from reshardctl.models.catalog import preset_config
from reshardctl.runtime.buffer_pool import BufferPool
from reshardctl.runtime.synthetic_weights import synthetic_region
from helpers.spawned_ranks import run_ranks

WORLD = 4


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _case_in_rank(cfg: str, transport: str) -> dict:
    """One steady-state refit of ``cfg`` with ``transport`` through its own Refitter, counted."""
    plan = api.plan_refit(model=cfg, train="ep=2", infer="tp=2", transport=transport)
    by_name = {t.name: t for t in plan.model.tensors}
    refitter = api.Refitter(plan, timeout_s=120)
    trainer = dist.get_rank() < plan.train_world
    holdings = refitter.holdings()
    local = {n: [synthetic_region(by_name[n], b, 0) for b in boxes] for n, boxes in holdings.items()}

    def refit(step):
        if trainer:
            for n, boxes in holdings.items():  # the trainer's step: its tensors written in place
                for b, t in zip(boxes, local[n]):
                    t.copy_(synthetic_region(by_name[n], b, step))
            refitter.refit(step, local_src=local)
        else:
            refitter.refit(step, local_dst=local)

    refit(1)
    refit(2)
    mode = _Count()
    with mode:
        if trainer:
            refitter.refit(3, local_src=local)  # the same bytes again: only the refit is counted
        else:
            refitter.refit(3, local_dst=local)
    gc.collect()
    before = len(gc.get_objects())
    refit(4)
    gc.collect()
    kept = len(gc.get_objects()) - before
    ok = trainer or all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, 4).view(torch.uint8))
                        for n, boxes in holdings.items() for b, t in zip(boxes, local[n]))
    # every rank hands over NEW tensors: the Refitter must not keep the old ones alive, and an
    # inference rank's new tensors get the step
    old = weakref.ref(next(iter(local.values()))[0])
    local = {n: [synthetic_region(by_name[n], b, 5 if trainer else 0) for b in boxes]
             for n, boxes in holdings.items()}
    if trainer:
        refitter.refit(5, local_src=local)
    else:
        refitter.refit(5, local_dst=local)
        ok = ok and all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, 5).view(torch.uint8))
                        for n, boxes in holdings.items() for b, t in zip(boxes, local[n]))
    gc.collect()
    freed = old() is None
    out = dict(trainer=trainer, regions=refitter.executor.program.counts["regions"],
               messages=refitter.executor.program.counts["p2p_messages"], ops=mode.ops, kept=kept, ok=ok,
               freed=freed)
    refitter.close()
    return out


def _rank(rank: int, port: int, cases: dict, q) -> None:
    """Every case in one process, one after the other (a Refitter each, as a framework that refits two
    models would): the counts of each are its own steady state (two refits before the counted one), so
    sharing the process (the ~4 s of imports and the rendezvous) changes none of them."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        out = {case: _case_in_rank(cfg, case[1]) for case, cfg in cases.items()}
        dist.destroy_process_group()
        q.put((rank, out, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def _config(tmp_path, experts: int) -> str:
    cfg = preset_config("tiny-qwen3-moe")
    scale = experts // 8
    cfg.update(num_hidden_layers=2, num_experts=experts, num_experts_per_tok=4,
               moe_intermediate_size=256 // scale, vocab_size=4096)
    path = tmp_path / f"moe-{experts}" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> dict[tuple[int, str], dict[int, dict]]:
    """{(experts, transport): {rank: counts}} for 8 and 32 experts with both transports, measured in
    one spawned world of 4 ranks (the tests below only read it)."""
    d = tmp_path_factory.mktemp("host-work")
    configs = {e: _config(d, e) for e in (8, 32)}
    cases = {(e, t): configs[e] for t in ("reshard", "gather_broadcast") for e in (8, 32)}
    by_rank = run_ranks(_rank, WORLD, lambda r, port, q: (r, port, cases, q))
    return {case: {r: by_rank[r][case] for r in range(WORLD)} for case in cases}


def test_torch_operations_per_refit_do_not_grow_with_regions(counted):
    few, many = counted[(8, "reshard")], counted[(32, "reshard")]
    for r in range(WORLD):
        a, b = few[r], many[r]
        assert a["ok"] and b["ok"], (r, a, b)  # the bytes arrived (independently of the checksums)
        assert b["regions"] >= 3 * a["regions"], (r, a, b)
        assert b["messages"] == a["messages"], (r, a, b)
        assert b["ops"] == a["ops"], (r, a, b)  # not one operation per region or per tensor
        assert a["kept"] <= 0 and b["kept"] <= 0, (r, a, b)  # nothing accumulates refit after refit
        assert a["freed"] and b["freed"], (r, a, b)  # replaced tensors are not held by the Refitter


def test_gather_and_broadcast_host_work_does_not_grow_with_tensors(counted):
    """The baseline too: a bucket member compares what it copied out of a bucket, and the bucket root
    its own pieces, in multi-tensor operations (piece_copy.copy_checked), not two per piece."""
    few, many = counted[(8, "gather_broadcast")], counted[(32, "gather_broadcast")]
    for r in range(WORLD):
        a, b = few[r], many[r]
        assert a["ok"] and b["ok"], (r, a, b)
        assert b["ops"] == a["ops"], (r, a, b)  # root: 385 vs 529 with one ne/any per own piece
        assert a["kept"] <= 0 and b["kept"] <= 0 and a["freed"] and b["freed"], (r, a, b)


class _Holder:
    def __init__(self):
        self.views: list = []

    def drop(self) -> None:
        self.views.clear()


def test_pool_tells_view_holders_before_it_frees_a_block_and_forgets_dead_ones():
    pool = BufferPool(torch.device("cpu"), limit_bytes=1 << 20)
    holder = _Holder()
    pool.notify_on_free(holder.drop)
    gone = _Holder()
    pool.notify_on_free(gone.drop)
    del gone  # held weakly: the pool does not keep it alive
    a = pool.acquire(600 << 10)
    holder.views.append(a[:16])
    pool.release(a)
    pool.acquire(100 << 10)  # fits next to the free block: nothing freed, views kept
    assert holder.views
    pool.acquire(700 << 10)  # over the limit: the free 600 KiB block goes, and the views of it first
    assert holder.views == []
    assert len(pool._on_free) == 1
    holder.views.append(torch.zeros(1))
    pool.clear()
    assert holder.views == []
