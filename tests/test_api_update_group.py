"""api.UpdateGroup: what a caller gets wrong is said before anything is built, and ranks that would
create different groups (a transport source on some ranks only) fail at once, naming the mistake.
The two-world refits themselves: tests/test_api_worlds.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from reshardctl import api
from reshardctl.errors import ReshardError, TransferError
from reshardctl.launch.ports import free_port

from helpers.small_llama import SMALL_LLAMA as SMALL
from helpers.spawned_ranks import run_ranks


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "expected host:port"), ("127.0.0.1:0", "port 1..65535"), (":29500", "expected host:port"),
    ("host:http", "expected host:port")])
def test_a_bad_address_is_refused(address, why):
    with pytest.raises(TransferError, match=why):
        api.UpdateGroup(address, "t", "train", 0).host_port()


def test_an_ipv6_address_in_brackets():
    assert api.UpdateGroup("[::1]:29500", "t", "train", 0).host_port() == ("::1", 29500)


def test_side_and_side_rank_are_checked_against_the_plan():
    assert api.UpdateGroup("h:1", "t", "train", 1).update_rank(2, 4) == 1
    assert api.UpdateGroup("h:1", "t", "infer", 3).update_rank(2, 4) == 5
    with pytest.raises(TransferError, match=r"side_rank 4: the plan has 4 infer ranks \(0..3\)"):
        api.UpdateGroup("h:1", "t", "infer", 4).update_rank(2, 4)
    with pytest.raises(TransferError, match="side 'trainer': expected one of train, infer"):
        api.UpdateGroup("h:1", "t", "trainer", 0).update_rank(2, 4)
    with pytest.raises(TransferError, match="UpdateGroup token is empty"):
        api.UpdateGroup("h:1", "", "train", 0).update_rank(2, 4)


def _rank(rank: int, ports: tuple[int, int], cfg: str, q) -> None:
    """No default world at all (``dist.is_initialized()`` stays False). First trainer 0 passes a
    transport source, inference rank 0 does not: refused, and no group of that attempt stays registered.
    Then both without: a refit commits, bit-exact."""
    from torch.distributed import distributed_c10d as c10d

    from reshardctl.runtime.synthetic_weights import synthetic_region

    try:
        torch.set_num_threads(1)
        plan = api.plan_refit(model=cfg, train="tp=1", infer="tp=1")
        side = "train" if rank == 0 else "infer"
        ug = api.UpdateGroup(f"127.0.0.1:{ports[0]}", "tok", side, 0, backend="gloo")
        source = (lambda: None) if rank == 0 else None
        try:
            api.Refitter(plan, update_group=ug, transport_source=source, timeout_s=60)
            out = "built"
        except ReshardError as exc:
            out = f"{type(exc).__name__}: {exc}"
        left = len(c10d._world.pg_map)
        refitter = api.Refitter(plan, update_group=api.UpdateGroup(f"127.0.0.1:{ports[1]}", "tok", side, 0,
                                                                   backend="gloo"), timeout_s=60)
        by_name = {t.name: t for t in plan.model.tensors}
        held = refitter.holdings()
        local = {n: [synthetic_region(by_name[n], b, 1 if side == "train" else 0) for b in bs] for n, bs in held.items()}
        report = refitter.refit(1, **({"local_src": local} if side == "train" else {"local_dst": local}))
        exact = all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, 1).view(torch.uint8))
                    for n, bs in held.items() for b, t in zip(bs, local[n]))
        refitter.close()
        at_end = len(c10d._world.pg_map)

        def broken():
            raise RuntimeError("ledger exploded")
        refitter = api.Refitter(plan, update_group=api.UpdateGroup(f"127.0.0.1:{ports[2]}", "tok", side, 0,
                                                                   backend="gloo"),
                                transport_source=broken if rank == 0 else (lambda: None), timeout_s=60)
        try:
            refitter.refit(2, **({"local_src": local} if side == "train" else {"local_dst": local}))
            failing = "committed"
        except ReshardError as exc:
            failing = f"{type(exc).__name__}: {exc}"
        untouched = all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, 1).view(torch.uint8))
                        for n, bs in held.items() for b, t in zip(bs, local[n]))
        refitter.close()
        q.put((rank, (out, dist.is_initialized(), left, report.committed, report.transport, exact, at_end,
                      failing, untouched), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_without_any_default_world_a_mismatch_is_refused_a_refit_commits_a_failing_source_stops_all(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMALL))
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    ports = tuple(sorted(ports))
    res = run_ranks(_rank, 2, lambda r, _p, q: (r, ports, str(cfg), q), timeout_s=300)
    for r in (0, 1):
        msg, initialised, left, committed, transport, exact, left_at_end, failing, untouched = res[r]
        assert msg.startswith("TransferError") and "would create different broadcast groups" in msg, msg
        assert "a transport source on every rank or on none" in msg
        assert initialised is False
        assert left == 0  # the control group made before the refusal was released
        assert committed is True and transport == "reshard" and exact is True
        assert left_at_end == 0
        # a transport source that raises on update rank 0 fails that refit on every rank, nothing moved
        assert failing == ("TransferError: refit of step 2 not started (nothing moved): the transport source "
                           "of update rank 0 failed: RuntimeError: ledger exploded"), failing
        assert untouched is True
