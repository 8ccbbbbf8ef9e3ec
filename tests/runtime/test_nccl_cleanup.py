"""What reshardctl aborts and how it builds its NCCL groups when a wait overruns (runtime/groups.py):
chosen on real process groups here (gloo, one process), with torch's NCCL-only abort recorded instead
of run, since no NCCL communicator exists on this machine. Under the API the default group belongs to
the RL framework and must survive reshardctl's failures; as reshardctl's own ranks it is ours."""

from __future__ import annotations

import os
import types

import pytest
import torch
import torch.distributed as dist

from reshardctl.api import _on
from reshardctl.runtime import abort as abort_module
from reshardctl.runtime import groups as groups_module


@pytest.fixture
def world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _recorded(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda group=None: calls.append(group))
    return calls


def test_under_the_api_only_reshardctls_own_groups_are_aborted(world, monkeypatch):
    """The API's data group and broadcast sub-groups, each once (a full-world broadcast group IS the data
    group); never the default group, which would take the framework's groups down with it."""
    data, sub = dist.new_group([0]), dist.new_group([0])
    g = types.SimpleNamespace(data=data, broadcast={(0,): sub, (0, 1): data})
    calls = _recorded(monkeypatch)
    abort_module.abort_data_plane(g)
    assert calls == [data, sub]
    assert None not in calls and dist.group.WORLD not in calls


def test_as_its_own_ranks_reshardctl_aborts_every_group(world, monkeypatch):
    """The CLI's ranks: the data plane is the default group, created by reshardctl: abort all."""
    g = types.SimpleNamespace(data=dist.group.WORLD, broadcast={(0,): dist.new_group([0])})
    calls = _recorded(monkeypatch)
    abort_module.abort_data_plane(g)
    assert calls == [None]


def test_an_abort_that_fails_does_not_stop_the_rank_from_reporting(world, monkeypatch):
    """An abort that raises (a communicator already gone) never reaches the caller, which goes on to
    report, and does not stop the aborts of the other groups: every group of reshardctl's is tried."""
    tried = []

    def boom(group=None):
        tried.append(group)
        raise RuntimeError("communicator already gone")
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", boom)
    data, sub = dist.new_group([0]), dist.new_group([0])
    abort_module.abort_data_plane(types.SimpleNamespace(data=data, broadcast={(0,): sub}))
    assert tried == [data, sub]


@pytest.mark.parametrize("before", [None, "3", "0"])
def test_nccl_error_handling_is_2_while_groups_are_built_then_the_callers_again(before, monkeypatch):
    """Each ProcessGroupNCCL reads TORCH_NCCL_ASYNC_ERROR_HANDLING when it is created: reshardctl's get
    2 (abort the communicator, keep the process), the framework's setting comes back afterwards."""
    var = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    if before is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, before)
    with groups_module.nccl_error_handling():
        assert os.environ[var] == "2"
    assert os.environ.get(var) == before
    with pytest.raises(RuntimeError):
        with groups_module.nccl_error_handling():
            raise RuntimeError("group creation failed")
    assert os.environ.get(var) == before


def test_a_users_own_setting_is_kept_for_reshardctls_own_ranks_only(monkeypatch):
    var = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    monkeypatch.setenv(var, "1")
    with groups_module.nccl_error_handling(keep_users=True):
        assert os.environ[var] == "1"
    monkeypatch.delenv(var)
    with groups_module.nccl_error_handling(keep_users=True):
        assert os.environ[var] == "2"
    assert var not in os.environ


@pytest.mark.parametrize("before", [None, "3"])
def test_the_apis_nccl_groups_are_built_bound_and_with_error_handling_2(world, monkeypatch, before):
    """``attach_groups`` as the API calls it (``own_data``) on an NCCL rank: its data group is created
    with ``device_id`` (where torch takes it) and with the variable at 2, its gloo control group with
    neither; the framework's value is back afterwards. ``new_group`` is recorded, then built on gloo."""
    var = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    if before is None:
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, before)
    calls, real = [], dist.new_group

    def new_group(ranks, **kw):
        calls.append((kw.get("backend"), kw.pop("device_id", None), os.environ.get(var)))
        kw["backend"] = "gloo"
        return real(ranks, **kw)
    monkeypatch.setattr(dist, "new_group", new_group)
    env = types.SimpleNamespace(world_size=1, global_rank=0, backend="nccl")
    plan = types.SimpleNamespace(broadcast_groups=lambda: [(0,)])
    cpu = torch.device("cpu")
    groups = groups_module.attach_groups(env, plan, cpu, 30.0, own_data=True)
    bound = cpu if groups_module._NEW_GROUP_BINDS else None
    assert calls == [("gloo", None, before), ("nccl", bound, "2")]
    assert groups.broadcast == {(0,): groups.data} and groups.data is not dist.group.WORLD
    assert os.environ.get(var) == before


def test_a_tensor_on_another_gpu_is_not_on_this_ranks_device():
    cuda0, cuda1, cpu = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")
    assert _on(cuda0, cuda0) and _on(cpu, cpu)
    assert not _on(cuda1, cuda0) and not _on(cuda0, cpu) and not _on(cpu, cuda0)
