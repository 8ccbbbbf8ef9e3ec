"""Device choice and backend strings (runtime/device.py), and their use in RankEnv / groups: pure, on
environment dicts and a given device count (no GPU needed)."""

from __future__ import annotations

import pytest

from reshardctl.errors import LaunchError
from reshardctl.runtime.device import cuda_device_index, data_plane_backend, local_rank_from, resolve_cuda_device
from reshardctl.runtime.env import RankEnv, choose_backend, make_rank_env, read_rank_env

BASE = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
CUDA = dict(cuda_available=lambda: True)


# ---- the table of device.py, case by case ----------------------------------------------------------
@pytest.mark.parametrize("env", [
    {"SLURM_LOCALID": "3"},                                   # srun --gpus-per-task=1: each task sees one
    {"SLURM_LOCALID": "7", "CUDA_VISIBLE_DEVICES": "7"},      # --gpu-bind=single:1 / a per-task variable
    {"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "GPU-1f2e3d4c-aaaa-bbbb-cccc-0123456789ab"},  # a UUID
    {},                                                       # one rank, one device
])
def test_one_visible_device_is_device_0_whatever_the_local_rank(env):
    c = cuda_device_index(env, visible=1)
    assert c.index == 0 and c.visible == 1 and "device 0" in c.why


def test_several_visible_devices_use_the_local_rank():
    assert cuda_device_index({"LOCAL_RANK": "3"}, visible=8).index == 3
    assert cuda_device_index({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "4,5"}, visible=2).index == 1
    assert cuda_device_index({}, visible=4).index == 0  # no local rank anywhere: 0


def test_local_rank_variables_in_env_py_order():
    env = {"RESHARDCTL_LOCAL_RANK": "2", "LOCAL_RANK": "1", "SLURM_LOCALID": "0"}
    assert local_rank_from(env) == (2, "RESHARDCTL_LOCAL_RANK")
    assert local_rank_from({"LOCAL_RANK": "1", "SLURM_LOCALID": "0"}) == (1, "LOCAL_RANK")
    assert local_rank_from({"SLURM_LOCALID": "4"}) == (4, "SLURM_LOCALID")
    assert local_rank_from({}) == (0, None)
    with pytest.raises(LaunchError, match="LOCAL_RANK='x' is not an integer"):
        local_rank_from({"LOCAL_RANK": "x"})


def test_local_rank_past_the_visible_devices_is_an_error_with_the_arithmetic():
    with pytest.raises(LaunchError) as info:
        cuda_device_index({"SLURM_LOCALID": "5", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, visible=4)
    msg = str(info.value)
    assert "SLURM_LOCALID=5" in msg and "sees 4 CUDA devices" in msg and "5 >= 4" in msg
    assert "CUDA_VISIBLE_DEVICES='0,1,2,3'" in msg and "--gpus-per-task=1" in msg
    with pytest.raises(LaunchError, match="LOCAL_RANK=2 .* 2 >= 2"):
        cuda_device_index({"LOCAL_RANK": "2"}, visible=2)


def test_no_visible_device_and_negative_local_rank_are_errors():
    with pytest.raises(LaunchError, match="no CUDA device visible.*CUDA_VISIBLE_DEVICES=''"):
        cuda_device_index({"CUDA_VISIBLE_DEVICES": ""}, visible=0)
    with pytest.raises(LaunchError, match="cannot be negative"):
        cuda_device_index({"LOCAL_RANK": "-1"}, visible=2)


def test_resolve_reads_the_given_environment_and_count():
    assert resolve_cuda_device(environ={"LOCAL_RANK": "1"}, device_count=lambda: 2).index == 1
    assert resolve_cuda_device(3, "SLURM_LOCALID", environ={}, device_count=lambda: 1).index == 0


# ---- RankEnv and groups agree -------------------------------------------------------------------------
def test_read_rank_env_resolves_the_device_under_slurm_binding():
    env = {**BASE, "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    # --gpus-per-task=1: one visible device, local id 1 -> cuda:0 (the old code used cuda:1 and failed)
    e = read_rank_env(4, 4, env, **CUDA, device_count=lambda: 1)
    assert (e.local_rank, e.cuda_index, e.device) == (1, 0, "cuda:0")
    # no binding, 4 GPUs per node: the local id
    e = read_rank_env(4, 4, env, **CUDA, device_count=lambda: 4)
    assert e.device == "cuda:1"
    with pytest.raises(LaunchError, match="SLURM_LOCALID=3 but this process sees 2 CUDA devices.*3 >= 2"):
        read_rank_env(4, 4, {**env, "SLURM_LOCALID": "3"}, **CUDA, device_count=lambda: 2)
    # gloo: no device resolution at all
    e = read_rank_env(4, 4, env, cuda_available=lambda: False, device_count=lambda: 0)
    assert (e.device, e.cuda_index) == ("cpu", None)


def test_torchrun_local_rank_names_its_variable():
    env = {**BASE, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    with pytest.raises(LaunchError, match="LOCAL_RANK=3 but this process sees 2"):
        read_rank_env(2, 2, env, **CUDA, device_count=lambda: 2)


def test_groups_device_is_rank_env_device(monkeypatch):
    import torch

    from reshardctl.runtime import groups

    e = RankEnv(1, 2, 1, "train", 1, "h", 1, "nccl", cuda_index=0)
    set_to = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append(d))
    assert groups._device(e) == torch.device(e.device) == torch.device("cuda", 0) and set_to == [torch.device("cuda", 0)]
    # unresolved (the local launcher's env): both resolve through device.py on this process's devices
    e = make_rank_env(1, 1, 1, "h", 1, backend="nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert e.device == "cuda:1" and groups._device(e) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert e.device == "cuda:0" and groups._device(e) == torch.device("cuda", 0)
    assert groups._device(make_rank_env(0, 1, 1, "h", 1)) == torch.device("cpu")


# ---- composite backend strings -------------------------------------------------------------------------
@pytest.mark.parametrize("name,want", [
    ("nccl", "nccl"), ("gloo", "gloo"), ("NCCL", "nccl"),
    ("cpu:gloo,cuda:nccl", "nccl"), ("cuda:nccl,cpu:gloo", "nccl"), (" cpu:gloo, cuda:nccl ", "nccl"),
    ("cuda:nccl", "nccl"), ("cpu:gloo", "gloo"), ("cpu:gloo,cuda:gloo", "gloo"),
])
def test_backend_strings(name, want):
    assert data_plane_backend(name) == want


@pytest.mark.parametrize("name", ["mpi", "ucc", "cpu:mpi", "cuda:ucc", "", "cpu:gloo,cuda:", "nccl,gloo"])
def test_unknown_backend_strings_are_refused(name):
    with pytest.raises(LaunchError, match="gloo or nccl"):
        data_plane_backend(name)


def test_rank_env_accepts_the_composite_backend():
    e = RankEnv(0, 2, 0, "train", 0, "h", 1, "cpu:gloo,cuda:nccl", cuda_index=0)
    assert e.backend == "nccl" and e.device == "cuda:0"
    assert RankEnv(0, 2, 0, "train", 0, "h", 1, "cpu:gloo").backend == "gloo"
    with pytest.raises(LaunchError, match="bad rank environment: backend 'mpi'"):
        RankEnv(0, 2, 0, "train", 0, "h", 1, "mpi")


def test_reshardctl_backend_variable_accepts_the_composite():
    assert choose_backend({"RESHARDCTL_BACKEND": "cpu:gloo,cuda:nccl"}, lambda: True) == "nccl"
    assert choose_backend({"RESHARDCTL_BACKEND": "cpu:gloo"}, lambda: True) == "gloo"
    with pytest.raises(LaunchError, match="RESHARDCTL_BACKEND='mpi'"):
        choose_backend({"RESHARDCTL_BACKEND": "mpi"}, lambda: True)
    with pytest.raises(LaunchError, match="CPU is forced"):
        choose_backend({"RESHARDCTL_BACKEND": "cpu:gloo,cuda:nccl", "RESHARDCTL_FORCE_CPU": "1"}, lambda: True)
