"""runtime/update_world.py: groups over a store of reshardctl's own, apart from the caller's default group.

The two-world refits themselves (real gloo processes) are in tests/test_api_worlds.py; here the pieces
that need no peers, in one spawned process of world 1 (its own default group: the pytest process
keeps none).
"""

from __future__ import annotations

import inspect
import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from reshardctl.runtime import update_world
from reshardctl.runtime.update_world import UpdateWorld, signature_problem

from helpers.spawned_ranks import run_ranks


def test_the_installed_torch_is_the_one_the_module_was_written_for():
    assert update_world.INCOMPATIBLE is None
    assert signature_problem(c10d._new_process_group_helper, c10d._world) is None


def test_another_signature_is_refused_with_what_differs():
    def helper(group_size, group_rank, backend, store, group_name, timeout=None):  # ranks_in_group gone
        raise AssertionError("never called")

    msg = signature_problem(helper, c10d._world)
    assert "_new_process_group_helper takes (group_size, group_rank, backend, store, group_name, timeout)" in msg
    assert "global_ranks_in_group" in msg
    assert signature_problem(None, c10d._world) == \
        "torch.distributed.distributed_c10d._new_process_group_helper is missing"

    class World:
        pg_map: dict = {}
        pg_names: dict = {}
    assert "_world.pg_group_ranks is missing" in signature_problem(c10d._new_process_group_helper, World())


def test_an_incompatible_torch_refuses_an_update_world(monkeypatch):
    monkeypatch.setattr(update_world, "INCOMPATIBLE", "the helper differs")
    with pytest.raises(RuntimeError, match=re.escape(f"torch {torch.__version__}: the helper differs")):
        UpdateWorld(dist.HashStore(), 0, 1, "u", timedelta(seconds=5))


def _split_guard(rank: int, q) -> None:
    """In a process whose default group has a bound device (as an NCCL framework's eager-initialised
    world has): does torch's helper ask for a split source from the default group (the split that, on
    NCCL, would build our communicator over the CALLER's members), with and without the update world's
    guard; is the binding restored, also after a creation that fails; do the groups work with update
    ranks; does a destroy leave nothing of ours."""
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        default = c10d._world.default_pg
        default.bound_device_id = torch.device("cuda", 0)  # what init_process_group(device_id=...) sets
        asked: list[str] = []
        real = c10d._get_split_source

        def spy(pg):
            asked.append("split source")
            return None  # gloo has none; on NCCL this is the caller's communicator
        c10d._get_split_source = spy
        out = {}
        try:
            c10d._new_process_group_helper(1, 0, [], "gloo", dist.HashStore(), c10d.GroupName("plain/1"),
                                           timeout=timedelta(seconds=5))
            out["unguarded_asks"] = len(asked)
            asked.clear()
            before = set(c10d._world.pg_map)
            world = UpdateWorld(dist.HashStore(), 0, 1, "upd", timedelta(seconds=5))
            pg = world.new_group([0], "gloo")
            out["guarded_asks"] = len(asked)
            out["bound_after"] = str(default.bound_device_id)
            t = torch.full((1,), 3.0)
            dist.all_reduce(t, group=pg)
            dist.broadcast(t, src=0, group=pg)  # src is an update rank, mapped through pg_group_ranks
            out["works"] = float(t.item())
            out["not_member"] = world.new_group([1, 2], "gloo") is None
            world._count = 0  # the same name again: torch refuses it inside the guarded creation
            try:
                world.new_group([0], "gloo")
                out["dup"] = "created"
            except ValueError as exc:
                out["dup"] = str(exc)
            out["bound_after_failure"] = str(default.bound_device_id)
            dist.destroy_process_group(pg)
            out["left"] = len(set(c10d._world.pg_map) - before)
            out["default_intact"] = dist.group.WORLD is default and default in c10d._world.pg_map
        finally:
            c10d._get_split_source = real
        dist.destroy_process_group()
        q.put((rank, out, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_groups_are_never_split_from_the_callers_default_group():
    out = run_ranks(_split_guard, 1, lambda r, _port, q: (r, q), timeout_s=120)[0]
    assert out["unguarded_asks"] == 1  # torch's own path would split from the caller's group
    assert out["guarded_asks"] == 0
    assert out["bound_after"] == "cuda:0" and out["bound_after_failure"] == "cuda:0"
    assert out["works"] == 3.0
    assert out["not_member"] is True
    assert "already been created" in out["dup"]
    assert out["left"] == 0 and out["default_intact"] is True


def test_every_private_torch_use_of_the_update_world_is_in_its_module():
    """The helper and the rank-mapping registry are touched only by update_world.py."""
    from pathlib import Path

    import reshardctl

    root = Path(inspect.getfile(reshardctl)).parent
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if any(w in p.read_text() for w in ("_new_process_group_helper", "pg_group_ranks", "_world.pg_map")))
    assert users == ["runtime/update_world.py"]


@pytest.fixture
def callers_world(tmp_path):
    """The caller's own default group (world 1, gloo), destroyed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _update_groups():
    from reshardctl.runtime.env import RankEnv
    from reshardctl.runtime.groups import Groups

    world = UpdateWorld(dist.HashStore(), 0, 1, "upd-abort", timedelta(seconds=5))
    g = Groups(RankEnv(0, 1, 0, "train", 0, "127.0.0.1", 1, "gloo"), torch.device("cpu"), timedelta(seconds=5))
    g.ctrl, g.data = world.new_group([0], "gloo"), world.new_group([0], "gloo")
    g.broadcast = {(0,): world.new_group([0], "gloo")}
    return g


def test_aborts_and_releases_take_only_the_update_worlds_groups(callers_world, monkeypatch):
    """abort.abort_data_plane on groups made in an update world aborts those (data, sub-group), never the
    caller's default group (torch's NCCL-only abort recorded: no NCCL here); groups.release destroys
    every one of ours (gloo) and leaves the caller's group registered and working."""
    from reshardctl.runtime import abort as abort_module
    from reshardctl.runtime.groups import release

    before = set(c10d._world.pg_map)
    g = _update_groups()
    calls: list = []
    monkeypatch.setattr(c10d, "_abort_process_group", lambda group=None: calls.append(group))
    abort_module.abort_data_plane(g)
    assert calls == [g.data, g.broadcast[(0,)]]
    monkeypatch.undo()
    g.aborted = False
    release(g)
    assert set(c10d._world.pg_map) == before
    assert dist.group.WORLD is callers_world
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 1.0
