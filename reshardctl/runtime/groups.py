"""Rendezvous and process groups, every blocking call bounded.

* Rendezvous: a ``TCPStore`` hosted by global rank 0 at ``master_addr:master_port``; the others
  connect as clients within the rendezvous timeout.
* The world group: gloo on CPU tensors, or NCCL on ``cuda:<local_rank>`` (``torch.cuda.set_device``
  first, eager communicator init via ``device_id``), ``timeout=`` bounding every operation.
* One sub-group per distinct broadcast group of the plan (of every plan of a session, all created up
  front), created by ALL ranks in the same (sorted) order, since ``new_group`` is collective; cached by
  member tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from reshardctl.errors import LaunchError, TransferError
from reshardctl.plan.schedule import BroadcastBucket
from reshardctl.runtime.env import RankEnv


@dataclass
class Groups:
    env: RankEnv
    device: torch.device
    timeout: timedelta
    broadcast: dict[tuple[int, ...], object] = field(default_factory=dict)  # members -> group (members only)

    def group_for(self, members: tuple[int, ...]):
        if self.env.global_rank not in members:
            raise TransferError(f"rank {self.env.global_rank} is not in broadcast group {members}")
        return self.broadcast[tuple(sorted(members))]


def rendezvous(env: RankEnv, timeout_s: float) -> dist.TCPStore:
    try:
        return dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, is_master=env.global_rank == 0,
            timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        raise LaunchError(
            f"rank {env.global_rank}: rendezvous at {env.master_addr}:{env.master_port} failed: {exc}",
            hint="is rank 0 running and the port free and reachable?",
        ) from exc


def broadcast_groups(plan) -> list[tuple[int, ...]]:
    """Every distinct broadcast group of the plan, or of a list of plans (sorted members), in a fixed order."""
    found: set[tuple[int, ...]] = set()
    for pl in plan if isinstance(plan, (list, tuple)) else [plan]:
        world = pl.train_world + pl.infer_world
        for r in range(world):
            for s in pl.steps_for(r):
                if isinstance(s, BroadcastBucket):
                    found.add(tuple(sorted(s.group)))
    return sorted(found)


def init_groups(env: RankEnv, plan, store: dist.Store, timeout_s: float) -> Groups:
    """``plan``: one plan or a list of plans (a session): the broadcast groups of all are created now."""
    if env.backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    try:
        kwargs = {"device_id": device} if env.backend == "nccl" else {}
        dist.init_process_group(env.backend, store=store, rank=env.global_rank, world_size=env.world_size,
                                timeout=timeout, **kwargs)
    except RuntimeError as exc:
        raise TransferError(f"rank {env.global_rank}: process group init ({env.backend}) failed: {exc}") from exc
    return attach_groups(env, plan, device, timeout_s)


def attach_groups(env: RankEnv, plan, device: torch.device, timeout_s: float) -> Groups:
    """On an initialised default group (ours, or an RL framework's): create the plan's broadcast
    sub-groups (collective: every rank calls this in the same order) and check every rank is there."""
    timeout = timedelta(seconds=timeout_s)
    try:
        groups = Groups(env, device, timeout)
        for members in broadcast_groups(plan):
            if len(members) == env.world_size:
                pg = dist.group.WORLD
            else:
                pg = dist.new_group(list(members), timeout=timeout, backend=env.backend)
            if env.global_rank in members:
                groups.broadcast[members] = pg
        # Every rank connected (and NCCL communicators up) before the first refit.
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)
        if int(probe.item()) != env.world_size:
            raise TransferError(f"group check: all-reduce gave {probe.item()}, expected {env.world_size}")
        return groups
    except RuntimeError as exc:
        raise TransferError(f"rank {env.global_rank}: process groups ({env.backend}) failed: {exc}") from exc


def shutdown() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out (a peer may be gone)
            pass
