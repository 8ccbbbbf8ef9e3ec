"""Process groups over a store of reshardctl's own, apart from the caller's default group: the update
world that joins a trainer job's processes and the inference engines' processes (each side keeps its
own default world, or none), as NeMo RL / OpenRLHF build their weight-update group.

torch's public ``new_group`` always builds over the default group (its members, its store, its
ranks); here each group is made by torch's own ``_new_process_group_helper`` over a ``PrefixStore`` of
the update world's store, and registered with the rank mapping ``{update rank: group rank}`` so that
``dist.broadcast / isend / irecv / P2POp / batch_isend_irecv / all_reduce(group=pg)`` take update
ranks, and ``destroy_process_group(pg)`` / ``_abort_process_group(pg)`` (groups.release,
abort.py) remove them again. Every use of torch's private API for this is in this module, checked
against the installed torch when it is imported (``INCOMPATIBLE``): a torch whose helper differs is
refused with a clear message when an update world is made, never half-used.

NCCL (one communicator per group, 512 GPUs): when the caller's default group is NCCL with a bound
device (``init_process_group(device_id=...)``: eager init), torch's helper SPLITS every new
communicator from the default group's (``ncclCommSplit`` over the default group's members: the
caller's world, not ours; the other side never joins that split and the creation hangs). While one of
our groups is created, the default group's ``bound_device_id`` is cleared and restored in ``finally``
(``_no_split_from_default``): our communicators are made from their own unique id in our store.
Our NCCL groups are bound to this rank's device (``device_id``: eager init, the communicator is up
when the group returns, inside the creation's deadline).
"""

from __future__ import annotations

import contextlib
import inspect
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

_HELPER_PARAMS = ("group_size", "group_rank", "global_ranks_in_group", "backend", "store", "group_name",
                  "timeout", "device_id")


def signature_problem(helper, world) -> str | None:
    """Why torch's private group machinery cannot be used as this module uses it (``None``: it can).
    ``helper``: ``_new_process_group_helper``; ``world``: ``_world``."""
    if helper is None:
        return "torch.distributed.distributed_c10d._new_process_group_helper is missing"
    try:
        names = list(inspect.signature(helper).parameters)
    except (TypeError, ValueError) as exc:
        return f"the signature of _new_process_group_helper cannot be read: {exc}"
    if names[:6] != list(_HELPER_PARAMS[:6]) or any(p not in names for p in _HELPER_PARAMS[6:]):
        return (f"_new_process_group_helper takes ({', '.join(names)}); reshardctl's update world needs "
                f"({', '.join(_HELPER_PARAMS[:6])}, ..., timeout, device_id)")
    for attr in ("pg_map", "pg_group_ranks", "pg_names"):
        if not isinstance(getattr(world, attr, None), dict):
            return f"torch.distributed.distributed_c10d._world.{attr} is missing"
    return None


# the helper's group_name type (a NewType of str in torch 2.13; plain str in releases before it)
_GROUP_NAME = getattr(_c10d, "GroupName", str)

# checked once, at import: None, or why an update world cannot be made with this torch
INCOMPATIBLE = signature_problem(getattr(_c10d, "_new_process_group_helper", None), getattr(_c10d, "_world", None))


def registered(pg) -> bool:
    """Whether ``pg`` is still in torch's registry of live groups (not yet destroyed or aborted)."""
    return pg is not None and pg in _c10d._world.pg_map


@contextlib.contextmanager
def _no_split_from_default():
    """The caller's default group without its bound device while one of our groups is created (see the
    module docstring: torch would split our NCCL communicator from the caller's, over the caller's
    members). Restored in ``finally``, also when the creation fails."""
    default = _c10d._world.default_pg if dist.is_initialized() else None
    bound = getattr(default, "bound_device_id", None) if default is not None else None
    if bound is not None:
        default.bound_device_id = None
    try:
        yield
    finally:
        if bound is not None:
            default.bound_device_id = bound


class UpdateWorld:
    """Groups among the update ranks ``0..size-1`` (``rank`` is this process's), made over ``store``
    (every member passes the same ``name``: the groups' names and store prefixes are ``name/<k>``,
    the k-th group created: every rank creates the same groups in the same order). ``device``: the
    rank's CUDA device for NCCL groups (bound: eager init)."""

    def __init__(self, store, rank: int, size: int, name: str, timeout: timedelta,
                 device: torch.device | None = None):
        if INCOMPATIBLE is not None:
            raise RuntimeError(f"torch {torch.__version__}: {INCOMPATIBLE}; reshardctl's two-world refit "
                               f"(api.UpdateGroup) supports the torch whose helper it was written for")
        if not 0 <= rank < size:
            raise ValueError(f"update rank {rank} outside an update world of {size}")
        self.store, self.rank, self.size, self.name = store, rank, size, name
        self.timeout, self.device = timeout, device
        self._count = 0

    def new_group(self, members, backend: str):
        """A group over the update ranks ``members`` with ``backend`` ("gloo" or "nccl"); ``None`` on a
        rank that is not a member (which still counts the group: names stay in step)."""
        self._count += 1
        members = sorted(members)
        if self.rank not in members:
            return None
        name = f"{self.name}/{self._count}"
        nccl = backend == "nccl"
        with _no_split_from_default():
            pg, _ = _c10d._new_process_group_helper(
                len(members), members.index(self.rank), [], backend, self.store, _GROUP_NAME(name),
                timeout=self.timeout, device_id=self.device if nccl else None,
            )
        _c10d._world.pg_group_ranks[pg] = {m: i for i, m in enumerate(members)}
        return pg
