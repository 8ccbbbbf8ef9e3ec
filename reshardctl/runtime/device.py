"""Which CUDA device a rank uses, and which data-plane backend a backend string means. Pure functions:
the environment and the device count are arguments (``resolve_cuda_device`` reads them for you).

Device choice (``cuda_device_index``). ``visible`` is ``torch.cuda.device_count()``: the devices this
process sees, after ``CUDA_VISIBLE_DEVICES`` and Slurm's cgroup/binding have been applied (the count,
not the variable, is authoritative: the variable may hold UUIDs or MIG names, or be unset under a
cgroup that hides devices). The local rank is the first of ``RESHARDCTL_LOCAL_RANK``, ``LOCAL_RANK``,
``SLURM_LOCALID`` that is set (the same order as env.py), else 0.

* visible == 1 (``srun --gpus-per-task=1``, ``--gpu-bind=single:1``, ``CUDA_VISIBLE_DEVICES`` with one
  entry per task, or one GPU and one rank): device 0, whatever the local rank is.
* visible == N > 1 (torchrun, ``reshardctl run``'s local launcher, srun without GPU binding: every rank
  sees the node's N GPUs): device ``local_rank``.
* visible == N > 1 and ``local_rank >= N`` (more ranks per node than GPUs it sees, or
  ``--gpus-per-task=k`` with 1 < k and several tasks per node): ``LaunchError`` naming the variable,
  the count, ``CUDA_VISIBLE_DEVICES`` and ``local_rank >= visible``.
* visible == 0 (``CUDA_VISIBLE_DEVICES=""`` or ``-1``, no GPU in the cgroup): ``LaunchError``.
* a negative local rank: ``LaunchError``.

One rank per GPU is the only supported binding: with ``--gpus-per-task=k`` (k > 1) a rank would use
only device ``local_rank`` of its k; bind one GPU per task instead.

Backend strings (``data_plane_backend``): ``dist.get_backend()`` returns ``"nccl"`` or ``"gloo"`` for a
group with one backend, and ``"cpu:gloo,cuda:nccl"`` (torch >= 2.x, a group created with
``backend="cpu:gloo,cuda:nccl"`` or with several device backends) for a composite one. The data plane
is NCCL whenever the cuda entry is NCCL (CUDA tensors go to NCCL), else gloo when gloo is named.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from reshardctl.errors import LaunchError

LOCAL_RANK_VARS = ("RESHARDCTL_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID")
DATA_PLANE_BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class DeviceChoice:
    index: int  # the CUDA device index to use (torch.device("cuda", index))
    local_rank: int
    visible: int  # torch.cuda.device_count()
    why: str  # one line: which case of the table applied


def local_rank_from(env: Mapping[str, str]) -> tuple[int, str | None]:
    """(local rank, the variable it came from): the first of ``LOCAL_RANK_VARS`` set, else (0, None)."""
    for key in LOCAL_RANK_VARS:
        if key in env and env[key].strip() != "":
            try:
                return int(env[key]), key
            except ValueError:
                raise LaunchError(f"{key}={env[key]!r} is not an integer") from None
    return 0, None


def _visible_text(env: Mapping[str, str]) -> str:
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if cvd is None else f"CUDA_VISIBLE_DEVICES={cvd!r}"


def cuda_device_index(env: Mapping[str, str], visible: int, local_rank: int | None = None,
                      local_from: str | None = None) -> DeviceChoice:
    """The CUDA device index of this rank (see the module's table). ``local_rank``: the rank's local
    rank when the caller already knows it (RankEnv), else read from ``env``; ``local_from`` names where
    it came from (for the error message). Raises ``LaunchError`` when no index is right."""
    if local_rank is None:
        local_rank, local_from = local_rank_from(env)
    where = f"{local_from}={local_rank}" if local_from else f"local rank {local_rank}"
    if local_rank < 0:
        raise LaunchError(f"{where}: a local rank cannot be negative")
    if visible <= 0:
        raise LaunchError(
            f"no CUDA device visible to this process (torch.cuda.device_count()=0, {_visible_text(env)})",
            hint="check the job's GPU request (--gpus-per-task / --gres) and CUDA_VISIBLE_DEVICES, or run with "
                 "RESHARDCTL_BACKEND=gloo",
        )
    if visible == 1:
        return DeviceChoice(0, local_rank, 1, f"one device visible ({_visible_text(env)}): device 0 whatever the "
                                              f"local rank ({where})")
    if local_rank >= visible:
        raise LaunchError(
            f"{where} but this process sees {visible} CUDA devices (torch.cuda.device_count()={visible}, "
            f"{_visible_text(env)}): device index {local_rank} >= {visible}",
            hint="start at most one rank per visible GPU on each node, or bind one GPU per task "
                 "(srun --gpus-per-task=1 or --gpu-bind=single:1), then every rank uses its device 0",
        )
    return DeviceChoice(local_rank, local_rank, visible,
                        f"{visible} devices visible ({_visible_text(env)}): device {local_rank} = {where}")


def resolve_cuda_device(local_rank: int | None = None, local_from: str | None = None,
                        environ: Mapping[str, str] | None = None,
                        device_count: Callable[[], int] | None = None) -> DeviceChoice:
    """``cuda_device_index`` on this process's environment and ``torch.cuda.device_count()``."""
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count
    return cuda_device_index(os.environ if environ is None else environ, device_count(), local_rank, local_from)


def data_plane_backend(name: str) -> str:
    """``"gloo"`` or ``"nccl"`` for a backend string: a plain one, or a composite ``"cpu:gloo,cuda:nccl"``
    (NCCL when a cuda entry is NCCL; else gloo when gloo is named). Raises ``LaunchError`` otherwise."""
    text = str(name).strip().lower()
    if text in DATA_PLANE_BACKENDS:
        return text
    entries: dict[str, str] = {}
    for part in text.split(","):
        dev, sep, backend = part.strip().partition(":")
        if not sep or not dev or not backend:
            entries = {}
            break
        entries[dev.strip()] = backend.strip()
    if entries:
        if entries.get("cuda") == "nccl":
            return "nccl"
        if "gloo" in entries.values() and "nccl" not in entries.values():
            return "gloo"
    raise LaunchError(
        f"backend {name!r}: reshardctl's data plane is gloo or nccl (or a composite such as "
        f"'cpu:gloo,cuda:nccl', whose cuda entry is used)",
    )
