"""After a failed refit: reshardctl's communicators aborted at once on CUDA, never destroyed before every
rank settled, and the old groups released on a rebuild (runtime/groups.py ``abort_after_failure``,
``release``, ``rebuild``; docs/gpu.md "Failures on NCCL").

The decision is observed on real gloo processes (the API's retry after a verification failure, torch's
registry of groups read before and after); what it does on CUDA is observed on stand-in groups whose
device says cuda, with torch's NCCL-only abort recorded (no NCCL on this machine)."""

from __future__ import annotations

import json
import types

import pytest
import torch
import torch.distributed as dist

from reshardctl import api
from reshardctl.errors import ReshardError
from reshardctl.runtime import abort as abort_module
from reshardctl.runtime import groups as groups_module
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.small_llama import SMALL_LLAMA as SMALL  # noqa: E402
from helpers.spawned_ranks import run_ranks

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


@pytest.fixture
def world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _record(monkeypatch) -> list:
    calls = []
    real_destroy = dist.destroy_process_group
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group",
                        lambda group=None: calls.append(("abort", group)))

    def destroy(group=None):
        calls.append(("destroy", group))
        real_destroy(group)
    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    return calls


def test_on_cuda_a_failure_aborts_once_and_the_release_never_destroys_an_nccl_group(world, monkeypatch):
    """reshardctl's own ranks: the refit's failure exit aborts every group (WORLD); the rebuild's release
    after settling does not abort again and never destroys (a destroy finalizes: it would wait for the
    kernels of a dead peer)."""
    g = groups_module.Groups(types.SimpleNamespace(global_rank=0), CUDA, None, data=dist.group.WORLD)
    calls = _record(monkeypatch)
    abort_module.abort_after_failure(g)
    abort_module.abort_after_failure(g)  # a second failure path of the same attempt (e.g. the wait's deadline)
    assert calls == [("abort", None)] and g.aborted
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # what torch's abort of WORLD leaves
    groups_module.release(g)
    assert calls == [("abort", None)]
    monkeypatch.undo()


def test_on_cuda_under_the_api_the_release_aborts_its_nccl_groups_and_destroys_its_gloo_control(world, monkeypatch):
    data, sub, ctrl = dist.new_group([0]), dist.new_group([0]), dist.new_group([0])
    g = groups_module.Groups(types.SimpleNamespace(global_rank=0), CUDA, None, ctrl=ctrl, data=data,
                             broadcast={(0,): sub})
    calls = _record(monkeypatch)
    groups_module.release(g)  # no failure exit before (a rebuild after a failure outside a refit)
    assert calls == [("abort", data), ("abort", sub), ("destroy", ctrl)]  # the gloo control group


def test_on_gloo_the_failure_exit_aborts_nothing_and_the_release_destroys(world, monkeypatch):
    data, ctrl = dist.new_group([0]), dist.new_group([0])
    g = groups_module.Groups(types.SimpleNamespace(global_rank=0), CPU, None, ctrl=ctrl, data=data)
    calls = _record(monkeypatch)
    abort_module.abort_after_failure(g)
    assert calls == [] and not g.aborted
    groups_module.release(g)
    assert calls == [("destroy", data), ("destroy", ctrl)]
    assert data not in dist.distributed_c10d._world.pg_map and ctrl not in dist.distributed_c10d._world.pg_map


def _rank(rank: int, world: int, port: int, cfg: str, q) -> None:
    """One API rank: a byte flipped on rank 3 at step 2, one retry; the order of failure exits and
    destroys, and torch's registry of groups before and after the rebuild."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        from reshardctl.runtime import refit as refit_module

        log: list = []
        real_exit, real_destroy = refit_module.abort_after_failure, dist.destroy_process_group

        def exit_(groups):
            log.append(("failure-exit", groups.attempt if hasattr(groups, "attempt") else None))
            real_exit(groups)

        def destroy(group=None):
            log.append(("destroy", None))
            real_destroy(group)
        refit_module.abort_after_failure = exit_
        dist.destroy_process_group = destroy
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, timeout_s=60)
        registry = dist.distributed_c10d._world.pg_map
        first = [id(pg) for pg in [refitter.groups.ctrl, *abort_module.own_groups(refitter.groups)]]
        sizes = [len(registry)]
        if rank == 3:
            done = []

            def tap(at, buf, n):
                if at == 2 and n > 0 and not done:
                    buf[n // 2] ^= 0x5A
                    done.append(at)
            refitter.executor.tap = tap
        holdings = refitter.holdings()
        local = {n: [synthetic_region(by_name[n], b, 0) for b in boxes] for n, boxes in holdings.items()}
        for step in (1, 2):
            if rank < plan.train_world:
                local = {n: [synthetic_region(by_name[n], b, step) for b in boxes] for n, boxes in holdings.items()}
                refitter.refit(step, local_src=local, retries=1)
            else:
                refitter.refit(step, local_dst=local, retries=1)
        sizes.append(len(registry))
        left = [i for i in first if i in {id(pg) for pg in registry}]
        refitter.close()
        q.put((rank, (log, sizes, left, refitter._attempt), None))
    except (BaseException, ReshardError) as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_a_failed_refit_exits_through_the_abort_before_any_destroy_and_the_rebuild_frees_the_old_groups(tmp_path):
    cfg = tmp_path / "small" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(SMALL))
    res = run_ranks(_rank, 4, lambda r, port, q: (r, 4, port, str(cfg), q), timeout_s=180)
    for rank, (log, sizes, left, attempt) in res.items():
        assert attempt == 1, rank  # one failed attempt, one rebuild
        kinds = [k for k, _ in log]
        assert kinds.count("failure-exit") == 1, (rank, log)  # once per failure, on every rank
        assert kinds.index("failure-exit") < kinds.index("destroy"), (rank, log)  # never destroy before
        assert sizes[1] == sizes[0], (rank, sizes)  # the rebuild did not leave the old groups behind
        assert left == [], rank  # none of the first attempt's groups is in torch's registry
