"""The abort of reshardctl's NCCL communicators after a failure: ``ncclCommAbort`` ends the kernels at
once (a destroy would finalize: wait for every kernel, forever for a dead peer). Under the API only the
groups reshardctl created, never the RL framework's (``own_groups``). gloo has no kernels: its groups
are released after settling (groups.release)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # annotations only: groups.py imports this module
    from reshardctl.runtime.groups import Groups


def abort_data_plane(groups: "Groups") -> None:
    """Abort reshardctl's NCCL communicators (torch's private abort; best effort; once per attempt: a
    group aborted is gone from torch's registry). Where reshardctl owns the default group (its own
    ranks: the data plane is WORLD) that is every group of the process; under the API only the groups
    it created (``own_groups``), never the RL framework's, in one NCCL group call as torch aborts several
    communicators (aborted one by one they can wait on each other). ``ncclCommAbort`` ends the kernels
    at once; a destroy (``ncclCommFinalize``) would wait for them, which for a dead peer is forever."""
    if getattr(groups, "aborted", False) or getattr(groups, "host_staged", False):
        return  # aborted already, or gloo on CUDA weights (host_staging.py): no communicator to abort
    try:
        groups.aborted = True
    except AttributeError:  # a read-only stand-in
        pass
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is None:
        return
    try:
        if groups.data is not None and groups.data is dist.group.WORLD:
            abort()
            return
        try:
            backend = groups.data._get_backend(torch.device("cuda"))
        except RuntimeError:  # no NCCL backend on this group
            backend = None
        grouped = hasattr(backend, "_group_start")
        if grouped:
            backend._group_start()
        try:
            for pg in own_groups(groups):
                try:
                    abort(pg)
                except Exception:  # noqa: BLE001 - one gone already (aborted before): the others still
                    pass
        finally:
            if grouped:
                backend._group_end()
    except Exception:  # noqa: BLE001 - best effort: the process must go on to report
        pass


def abort_after_failure(groups: "Groups | None") -> None:
    """The exit of every failed refit (runtime/refit.py), on every rank (the root cause, a knock-on
    ``Abandoned``, a verification failure): on CUDA reshardctl's communicators are aborted now, before
    the rank settles, so no NCCL kernel of the attempt keeps spinning on the GPU and no device-wide sync
    (the framework's, or this rank's own teardown) waits for one. gloo has no kernels: its groups are
    released after settling (``release``)."""
    if on_nccl(groups):
        abort_data_plane(groups)


def on_nccl(groups: "Groups | None") -> bool:
    """The data plane is NCCL on a CUDA device: its works are waited on the device, its communicators
    aborted after a failure. False on gloo, also with CUDA weights staged through the host
    (``Groups.host_staged``, host_staging.py), whose waits block in gloo and have nothing to abort."""
    return groups is not None and groups.device.type == "cuda" and not getattr(groups, "host_staged", False)


def own_groups(groups: "Groups") -> list:
    """The data-plane groups reshardctl created (its data group and broadcast sub-groups), each once;
    never the default group (WORLD), which is the RL framework's under the API."""
    out: list = []
    for pg in [groups.data, *groups.broadcast.values()]:
        if pg is not None and pg is not dist.group.WORLD and all(pg is not q for q in out):
            out.append(pg)
    return out
