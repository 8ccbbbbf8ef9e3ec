"""How a process joins the refit's update world when trainer and inference processes each keep their
own default world (``api.UpdateGroup``), and which data plane that world uses (docs/api.md, "Two worlds")."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.device import data_plane_backend
from reshardctl.runtime.env import SIDES


@dataclasses.dataclass(frozen=True)
class UpdateGroup:
    """How this process joins the refit's update world when trainer and inference processes each keep
    their own default world (or none), as NeMo RL / OpenRLHF / verl run them: ``address`` ("host:port")
    is where update rank 0 (trainer ``side_rank`` 0) hosts the store, listening on that address only;
    ``token`` the run's secret (a process without it is refused at the rendezvous, and the records the
    ranks act on are sealed with keys derived from it); update ranks are ``side_rank`` for trainers and
    ``T + side_rank`` for inference ranks. ``backend``: "gloo", "nccl", or "auto" (NCCL when the bound
    parameters, else the caller's default group, else this machine's devices are CUDA)."""

    address: str
    token: str
    side: str
    side_rank: int
    backend: str = "auto"

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.address.rpartition(":")
        host = host.strip("[]")  # "[::1]:29500"
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise TransferError(f"UpdateGroup address {self.address!r}: expected host:port (port 1..65535)")
        return host, int(port)

    def update_rank(self, train_world: int, infer_world: int) -> int:
        if not self.token:
            raise TransferError("UpdateGroup token is empty: the update world admits only processes that hold the "
                                "run's secret token (the same non-empty string on every process)")
        if self.side not in SIDES:
            raise TransferError(f"UpdateGroup side {self.side!r}: expected one of {', '.join(SIDES)}")
        n = train_world if self.side == "train" else infer_world
        if not 0 <= self.side_rank < n:
            raise TransferError(f"UpdateGroup side_rank {self.side_rank}: the plan has {n} {self.side} ranks "
                                f"(0..{n - 1})")
        return self.side_rank if self.side == "train" else train_world + self.side_rank


def update_backend(wanted: str, binding) -> str:
    """The data plane of an update world: ``wanted``, or for "auto" the bound parameters' device, else
    the caller's default group's data plane, else NCCL where CUDA is available."""
    if wanted in ("gloo", "nccl"):
        return wanted
    if wanted != "auto":
        raise TransferError(f"UpdateGroup backend {wanted!r}: expected 'gloo', 'nccl' or 'auto'")
    device = getattr(binding, "device", None)
    if device is not None:
        return "nccl" if torch.device(device).type == "cuda" else "gloo"
    if dist.is_available() and dist.is_initialized():
        return data_plane_backend(dist.get_backend())
    return "nccl" if torch.cuda.is_available() else "gloo"
