"""The Python API inside the caller's own processes: real gloo processes, real bytes.

Each spawned process initialises torch.distributed itself (as an RL framework would), builds the
plan with ``api.plan_refit``, hands its own tensors to ``Refitter.refit`` and checks every byte it
ends up with against the synthetic generator, independently of the runtime's checksums.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from reshardctl import api
from reshardctl.errors import ReshardError
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.executor_taps import corrupt_once
from helpers.small_llama import SMALL_LLAMA as SMALL  # noqa: E402
from helpers.spawned_ranks import run_ranks


def _update(local, holdings, by_name, step: int, how: str) -> dict:
    """The caller's tensors at ``step``: new tensors (``new``), the same tensors written in place
    (``in_place``, as an optimizer does; ``parameters``: ``nn.Parameter``s that require grad, written
    under ``no_grad`` as an optimizer step does), or the same tensor objects moved to new storage
    (``set_``)."""
    if how == "new":
        return {n: [synthetic_region(by_name[n], b, step) for b in boxes] for n, boxes in holdings.items()}
    with torch.no_grad():
        for n, boxes in holdings.items():
            for b, t in zip(boxes, local[n]):
                if how in ("in_place", "parameters"):
                    t.copy_(synthetic_region(by_name[n], b, step))
                else:
                    t.set_(synthetic_region(by_name[n], b, step))
    return local


def _case(rank: int, cfg: str, transport: str, corrupt: int | None, retries: int, how: str) -> list:
    """One case in its own Refitter: [(step, ok or the error's type, the step the caller's tensors hold)]."""
    plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2", transport=transport)
    by_name = {t.name: t for t in plan.model.tensors}
    refitter = api.Refitter(plan, timeout_s=60)
    if corrupt is not None and rank == 3:
        refitter.executor.tap = corrupt_once(corrupt)
    holdings = refitter.holdings()
    trainer = rank < plan.train_world
    # the caller's own tensors: inference ranks start on step-0 weights
    local = {n: [synthetic_region(by_name[n], b, 0) for b in boxes] for n, boxes in holdings.items()}
    if how == "parameters":  # a model's own parameters, on both sides
        local = {n: [torch.nn.Parameter(t) for t in ts] for n, ts in local.items()}
    results = []
    for step in (1, 2, 3) if corrupt is not None else (1, 2):
        try:
            if trainer:
                local = _update(local, holdings, by_name, step, how)
                refitter.refit(step, local_src=local, retries=retries)
            else:
                if how == "set_" and step == 2:  # the caller moves its tensors: the commit must follow
                    for ts in local.values():
                        for t in ts:
                            t.set_(t.clone())
                refitter.refit(step, local_dst=local, retries=retries)
            ok = True
        except ReshardError as exc:
            ok = type(exc).__name__
        held = None
        if not trainer:  # which step's bytes the caller's tensors hold now (independent check)
            for want in (step, step - 1):
                if all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, want).view(torch.uint8))
                       for n, boxes in holdings.items() for b, t in zip(boxes, local[n])):
                    held = want
                    break
        results.append((step, ok, held))
    refitter.close()
    return results


def _mistake(rank: int, cfg: str) -> str:
    """Trainer rank 1 forgets a tensor: what each rank's refit says."""
    plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
    by_name = {t.name: t for t in plan.model.tensors}
    refitter = api.Refitter(plan, timeout_s=60)
    holdings = refitter.holdings()
    local = {n: [synthetic_region(by_name[n], b, 1) for b in boxes] for n, boxes in holdings.items()}
    if rank == 1:  # this trainer forgets a tensor: it must still take part so no peer hangs
        local.pop(next(iter(local)))
    try:
        if rank < plan.train_world:
            refitter.refit(1, local_src=local)
        else:
            refitter.refit(1, local_dst=local)
        return "committed"
    except ReshardError as exc:
        return f"{type(exc).__name__}: {exc}"


# name: (transport, corrupt at step, retries, how the caller updates its tensors). One spawned world of 4
# ranks runs them in this order, each through a Refitter of its own (fresh groups, fresh executor: a
# tap set for one case is gone in the next), as a framework that refits twice in one job would; the
# cases that fail a refit come last, the caller's mistake (it leaves its Refitter open) at the very end.
CASES = {
    "reshard": ("reshard", None, 0, "new"),
    "gather_broadcast": ("gather_broadcast", None, 0, "new"),
    "in_place": ("reshard", None, 0, "in_place"),
    "set_": ("reshard", None, 0, "set_"),
    "parameters": ("reshard", None, 0, "parameters"),
    "corrupt": ("reshard", 2, 0, "new"),
    "retry": ("reshard", 2, 1, "new"),
}


def _rank(rank: int, world: int, port: int, cfg: str, q) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        out = {name: _case(rank, cfg, *case) for name, case in CASES.items()}
        out["mistake"] = _mistake(rank, cfg)
        dist.destroy_process_group()
        q.put((rank, out, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.fixture(scope="module")
def refits(tmp_path_factory) -> dict[str, dict[int, object]]:
    """{case: {rank: its results}} for every case of ``CASES`` and ``"mistake"`` (the tests only read it)."""
    cfg = tmp_path_factory.mktemp("api") / "config.json"
    cfg.write_text(json.dumps(SMALL))
    res = run_ranks(_rank, 4, lambda r, port, q: (r, 4, port, str(cfg), q), timeout_s=600)
    return {name: {r: res[r][name] for r in res} for name in [*CASES, "mistake"]}


@pytest.mark.parametrize("transport", ["reshard", "gather_broadcast"])
def test_refit_in_caller_processes(refits, transport):
    res = refits[transport]
    for r in (2, 3):  # inference ranks: committed, and their own tensors hold step 1 then step 2
        assert res[r] == [(1, True, 1), (2, True, 2)]
    for r in (0, 1):
        assert [ok for _, ok, _ in res[r]] == [True, True]


@pytest.mark.parametrize("how", ["in_place", "set_", "parameters"])
def test_the_same_tensors_again_are_read_afresh(refits, how):
    """The Refitter reuses what it built for the caller's tensors while they are the same tensors at the
    same addresses (api.py ``_local``; the executor's piece views): values written in place between
    refits must still travel, and tensors moved to new storage (``set_``: same objects, new
    addresses; inference ranks move theirs before step 2) must be read and written at their new place.
    ``parameters``: both sides hand over ``nn.Parameter``s that require grad (a model's own weights);
    the commit writes into them without autograd complaining about an in-place write to a leaf."""
    res = refits[how]
    for r in (2, 3):
        assert res[r] == [(1, True, 1), (2, True, 2)]


def test_failed_refit_leaves_caller_tensors_untouched_and_the_refitter_survives(refits):
    """A byte flipped on inference rank 3 (global) at step 2: every rank raises VerificationError and
    both inference ranks' own tensors still hold step 1; the next refit (fresh groups) commits step 3."""
    res = refits["corrupt"]
    for r in (2, 3):
        assert res[r] == [(1, True, 1), (2, "VerificationError", 1), (3, True, 3)]
    for r in (0, 1):
        assert [ok for _, ok, _ in res[r]] == [True, "VerificationError", True]


def test_refit_retries_after_a_failed_attempt(refits):
    res = refits["retry"]
    for r in (2, 3):
        assert res[r] == [(1, True, 1), (2, True, 2), (3, True, 3)]


def test_a_caller_mistake_on_one_rank_fails_every_rank_without_a_hang(refits):
    out = refits["mistake"]
    assert "local_src lacks 1 tensor" in out[1]
    assert all(res.startswith("TransferError") for res in out.values()), out
