"""A rank's environment, read in ONE place.

Conventions, first match wins:

1. reshardctl's own launcher: ``RESHARDCTL_RANK``, ``RESHARDCTL_WORLD_SIZE``, ``RESHARDCTL_LOCAL_RANK``
   (plus ``RESHARDCTL_MASTER_ADDR`` / ``RESHARDCTL_MASTER_PORT``).
2. torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
3. Slurm: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``. In a heterogeneous
   job step (``SLURM_NTASKS_HET_GROUP_<k>`` set) ``SLURM_PROCID`` is step-global: component 0 is the
   trainer side, so a rank is a trainer when ``PROCID < NTASKS_HET_GROUP_0``, and the world is the sum
   of the components. For two separate jobs (one per side) ``RESHARDCTL_SIDE=train|infer`` says which
   side this job is; ``SLURM_PROCID`` is then the side-local rank.

Global ranks: trainers ``0..T-1``, inference ``T..T+I-1``. The master address and port come from
``RESHARDCTL_MASTER_*`` or ``MASTER_*`` (the sbatch template exports them).
``RESHARDCTL_BACKEND=gloo|nccl|auto`` and ``RESHARDCTL_FORCE_CPU=1`` choose the backend; a composite
backend string (``"cpu:gloo,cuda:nccl"``, what ``dist.get_backend()`` returns for such a group) is
accepted everywhere and normalised to its data plane (device.py: NCCL when the cuda entry is NCCL).

The CUDA device of an NCCL rank is chosen in ONE place, ``device.cuda_device_index`` (the table in
device.py: device 0 when the process sees one device, e.g. ``srun --gpus-per-task=1``; the local rank
when it sees several); ``RankEnv.device`` and ``groups`` both go through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from reshardctl.errors import LaunchError
from reshardctl.runtime.device import data_plane_backend, resolve_cuda_device
from reshardctl.topology import global_of, side_of_global

SIDES = ("train", "infer")


@dataclass(frozen=True)
class RankEnv:
    global_rank: int
    world_size: int
    local_rank: int
    side: str  # "train" | "infer"
    side_rank: int
    master_addr: str
    master_port: int
    backend: str  # "gloo" | "nccl" (a composite "cpu:gloo,cuda:nccl" is normalised to its data plane)
    node_rank: int = 0
    source: str = "explicit"  # which convention it was read from
    cuda_index: int | None = None  # NCCL: the CUDA device, when already resolved (else resolved on use)
    # gloo carrying CUDA weights through host memory (RunOptions.device "cuda-gloo", runtime/host_staging.py):
    # the weights on the device NCCL would use (one GPU: cuda:0 for every rank), the bytes through gloo
    host_staged: bool = False

    def __post_init__(self) -> None:
        problems = []
        try:
            object.__setattr__(self, "backend", data_plane_backend(self.backend))
        except LaunchError as exc:
            problems.append(exc.message)
        if not 0 <= self.global_rank < self.world_size:
            problems.append(f"rank {self.global_rank} outside world of {self.world_size}")
        if self.side not in SIDES:
            problems.append(f"side {self.side!r} is not one of {SIDES}")
        if self.host_staged and self.backend != "gloo":
            problems.append(f"host-staged CUDA weights are carried by gloo, not {self.backend}")
        if not 0 < self.master_port < 65536:
            problems.append(f"master port {self.master_port} out of range")
        if problems:
            raise LaunchError("bad rank environment: " + "; ".join(problems))

    @property
    def device(self) -> str:
        """``"cpu"`` on gloo; on NCCL (and for gloo's host-staged CUDA weights) ``"cuda:<i>"`` with ``i``
        from ``device.cuda_device_index`` (raises ``LaunchError`` when no device index is right, naming
        the variables)."""
        if self.backend != "nccl" and not self.host_staged:
            return "cpu"
        if self.cuda_index is not None:
            return f"cuda:{self.cuda_index}"
        return f"cuda:{resolve_cuda_device(self.local_rank, _LOCAL_VAR.get(self.source)).index}"


# where each convention's local rank comes from (named in device-choice errors)
_LOCAL_VAR = {"reshardctl": "RESHARDCTL_LOCAL_RANK", "torchrun": "LOCAL_RANK", "slurm": "SLURM_LOCALID",
              "slurm-het": "SLURM_LOCALID", "slurm-split": "SLURM_LOCALID"}


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchError(f"{key}={env[key]!r} is not an integer") from None


def check_backend_env(env: Mapping[str, str] | None = None) -> None:
    """Refuse (``InputError``, exit 2) a ``RESHARDCTL_BACKEND`` the ranks would refuse, before any starts."""
    from reshardctl.errors import InputError

    env = os.environ if env is None else env
    want = env.get("RESHARDCTL_BACKEND")
    if want is None or want.strip().lower() == "auto":
        return
    try:
        data_plane_backend(want)
    except LaunchError:
        raise InputError(f"environment variable RESHARDCTL_BACKEND={want[:80]!r}: expected gloo, nccl, auto or a "
                         "composite such as cpu:gloo,cuda:nccl", hint="unset it for the default (auto)") from None


def choose_backend(env: Mapping[str, str], cuda_available: Callable[[], bool], force_cpu: bool = False) -> str:
    want = env.get("RESHARDCTL_BACKEND", "auto").strip().lower()
    cpu = force_cpu or env.get("RESHARDCTL_FORCE_CPU", "") not in ("", "0", "false")
    if want != "auto":
        try:
            want = data_plane_backend(want)
        except LaunchError:
            raise LaunchError(f"RESHARDCTL_BACKEND={want!r}: use gloo, nccl or auto") from None
    if want in ("gloo", "nccl"):
        if want == "nccl" and cpu:
            raise LaunchError("RESHARDCTL_BACKEND=nccl but the CPU is forced (RESHARDCTL_FORCE_CPU / --device cpu)")
        return want
    return "nccl" if (not cpu and cuda_available()) else "gloo"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def read_rank_env(
    train_world: int,
    infer_world: int,
    environ: Mapping[str, str] | None = None,
    *,
    force_cpu: bool = False,
    cuda_available: Callable[[], bool] = _cuda_available,
    device_count: Callable[[], int] | None = None,
) -> RankEnv:
    """Read this process's rank from the environment, for a plan of ``train_world + infer_world`` ranks.
    On NCCL the CUDA device is resolved now (``device_count``: ``torch.cuda.device_count`` by default),
    so a wrong binding fails before the rendezvous, with the variables and the arithmetic."""
    env = os.environ if environ is None else environ
    world = train_world + infer_world
    node = 0
    if "RESHARDCTL_RANK" in env:
        source = "reshardctl"
        rank = _int(env, "RESHARDCTL_RANK")
        size = _int(env, "RESHARDCTL_WORLD_SIZE") if "RESHARDCTL_WORLD_SIZE" in env else world
        local = _int(env, "RESHARDCTL_LOCAL_RANK") if "RESHARDCTL_LOCAL_RANK" in env else 0
    elif "RANK" in env and "WORLD_SIZE" in env:
        source = "torchrun"
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0
        node = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else 0
    elif "SLURM_PROCID" in env:
        procid = _int(env, "SLURM_PROCID")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
        groups = []
        while f"SLURM_NTASKS_HET_GROUP_{len(groups)}" in env:
            groups.append(_int(env, f"SLURM_NTASKS_HET_GROUP_{len(groups)}"))
        side_env = env.get("RESHARDCTL_SIDE")
        if groups:
            source = "slurm-het"
            if groups[0] != train_world:
                raise LaunchError(
                    f"het group 0 has {groups[0]} tasks but the plan has {train_world} trainer ranks",
                    hint="component 0 of the het job must be the trainer side",
                )
            rank, size = procid, sum(groups)
        elif side_env is not None:
            source = "slurm-split"
            if side_env not in SIDES:
                raise LaunchError(f"RESHARDCTL_SIDE={side_env!r}: use train or infer")
            rank = global_of(side_env, procid, train_world)
            size = world
            ntasks = _int(env, "SLURM_NTASKS") if "SLURM_NTASKS" in env else None
            expect = train_world if side_env == "train" else infer_world
            if ntasks is not None and ntasks != expect:
                raise LaunchError(f"this {side_env} job has SLURM_NTASKS={ntasks} but the plan needs {expect}")
        else:
            source = "slurm"
            rank, size = procid, _int(env, "SLURM_NTASKS")
    else:
        raise LaunchError(
            "no rank in the environment (RESHARDCTL_RANK, RANK or SLURM_PROCID)",
            hint="start workers through `reshardctl run`, torchrun or srun",
        )
    if size != world:
        raise LaunchError(
            f"world size {size} ({source}) but the plan has {train_world} trainer + {infer_world} inference"
            f" = {world} ranks"
        )
    addr = env.get("RESHARDCTL_MASTER_ADDR") or env.get("MASTER_ADDR")
    port = env.get("RESHARDCTL_MASTER_PORT") or env.get("MASTER_PORT")
    if not addr or not port:
        raise LaunchError(
            f"no rendezvous address for rank {rank} ({source})",
            hint="export MASTER_ADDR and MASTER_PORT (or RESHARDCTL_MASTER_ADDR/PORT) in the job script",
        )
    try:
        port_i = int(port)
    except ValueError:
        raise LaunchError(f"master port {port!r} is not an integer") from None
    side, side_rank = side_of_global(rank, train_world)
    backend = choose_backend(env, cuda_available, force_cpu)
    cuda_index = None
    if backend == "nccl":
        cuda_index = resolve_cuda_device(local, _LOCAL_VAR.get(source), env, device_count).index
    return RankEnv(
        global_rank=rank,
        world_size=size,
        local_rank=local,
        side=side,
        side_rank=side_rank,
        master_addr=addr,
        master_port=port_i,
        backend=backend,
        node_rank=node,
        source=source,
        cuda_index=cuda_index,
    )


def make_rank_env(
    global_rank: int, train_world: int, infer_world: int, master_addr: str, master_port: int,
    *, backend: str = "gloo", local_rank: int | None = None, host_staged: bool = False,
) -> RankEnv:
    """A RankEnv built directly (the local launcher: one machine, local rank = global rank)."""
    side, side_rank = side_of_global(global_rank, train_world)
    return RankEnv(
        global_rank=global_rank,
        world_size=train_world + infer_world,
        local_rank=global_rank if local_rank is None else local_rank,
        side=side,
        side_rank=side_rank,
        master_addr=master_addr,
        master_port=master_port,
        backend=backend,
        host_staged=host_staged,
    )
