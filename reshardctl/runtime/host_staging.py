"""gloo as the data plane of ranks whose weights live on a CUDA device: every message through host memory.

``RunOptions.device = "cuda-gloo"`` (the local launcher; docs/gpu.md, "What one GPU proves"): each rank's
weights, arena, staging blocks and checksums are on its CUDA device (on a one-GPU machine every rank
shares ``cuda:0``), so the executor takes its CUDA path (side stream, stream waits, release events, device
spans, the deadline thread), while the bytes cross between processes through gloo. NCCL cannot do this on
one GPU: it refuses two ranks of one communicator on the same device.

gloo's point-to-point operations take CPU tensors only (torch.distributed's backend table: send and recv
on GPU are not supported by gloo), so the executor's posts go through here (``Groups.host_staged``):

* a send: the device view is copied into a pinned host buffer on the current stream (which already waits
  for the side stream's pack), the host waits for that copy (one event per post: gloo reads the host
  buffer from its own thread), and gloo sends the host buffer;
* a receive: gloo receives into a pinned host buffer; ``wait()`` waits for it (bounded:
  ``bounded_wait.run_bounded``, which also stops at another rank's published failure) and enqueues the
  copy into the device view on the current stream, so the executor's ``side.wait_stream(current)`` orders
  the unpack and its checksums after the landing, as after an NCCL ``work.wait()``;
* a broadcast: the same, the root's bucket copied to the host first.

The pinned buffers come from torch's caching host allocator, which keeps a buffer used by a
non-blocking copy until that copy completed. A wait is bounded by the run's timeout; the failure
exit has nothing to abort (gloo has no kernels: ``abort.on_nccl`` is False for these groups).

What this path does not show: NCCL's own behaviour, and the timing of a GPU refit (one host sync per
post, every byte through host memory twice). ``stage_cpu`` stages CPU tensors too (the CPU tests of
this module: the same copies through separate host buffers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from reshardctl.runtime.bounded_wait import run_bounded, wait_all

if TYPE_CHECKING:  # annotations only
    from reshardctl.runtime.groups import Groups


class StagedWork:
    """Works over host buffers, and the device views their received bytes land in once they completed."""

    def __init__(self, works: list, landings: list[tuple[torch.Tensor, torch.Tensor]], keep: list,
                 groups: "Groups | None", what: str):
        self._works = works
        self._landings = landings  # (device view, host buffer) per receive
        self._keep = keep  # the host buffers gloo reads or writes: alive until the works completed
        self._groups = groups
        self._what = what
        self._landed = False

    def is_completed(self) -> bool:
        """Every host transfer completed and its bytes were handed to the device (``wait`` ran)."""
        return self._landed or (not self._landings and all(w.is_completed() for w in self._works))

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - torch's Work signature; the run's timeout bounds it
        """Wait for the host transfers (bounded, stops at another rank's failure), then enqueue every
        received buffer's copy into its device view on the current stream. Once per work."""
        if self._landed:
            return True
        limit = self._groups.timeout.total_seconds() if self._groups is not None else 60.0
        run_bounded(lambda: wait_all(self._works), self._groups, limit, self._what)
        for view, host in self._landings:
            view.copy_(host.view(view.shape), non_blocking=view.is_cuda)
        self._landed = True
        self._keep = []
        return True


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """An empty host buffer for ``t``'s bytes: pinned where ``t`` is on a CUDA device."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)


def _staged(t: torch.Tensor, stage_cpu: bool) -> bool:
    return t.is_cuda or stage_cpu


def _host_wait(sent: list[torch.Tensor]) -> None:
    """The device-to-host copies of ``sent`` (enqueued on the current stream) complete before gloo reads them."""
    if any(t.is_cuda for t in sent):
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(next(t for t in sent if t.is_cuda).device))
        done.synchronize()


def post_p2p(ops: list, groups: "Groups | None", what: str, *, stage_cpu: bool = False) -> list[StagedWork]:
    """``dist.batch_isend_irecv(ops)`` with every device tensor staged through host memory; one work."""
    host_ops, landings, keep, sent = [], [], [], []
    for op in ops:
        t = op.tensor
        if not _staged(t, stage_cpu):
            host_ops.append(op)
            continue
        h = _host_copy(t)
        if op.op is dist.isend or op.op is dist.send:
            h.copy_(t, non_blocking=t.is_cuda)
            sent.append(t)
        else:
            landings.append((t, h))
        keep.append(h)
        host_ops.append(dist.P2POp(op.op, h, op.peer, group=op.group, tag=op.tag))
    _host_wait(sent)
    works = dist.batch_isend_irecv(host_ops) if host_ops else []
    return [StagedWork(list(works), landings, keep, groups, what)]


def broadcast(buf: torch.Tensor, src: int, group, groups: "Groups | None", rank: int, what: str, *,
              stage_cpu: bool = False) -> StagedWork:
    """``dist.broadcast(buf, src, group, async_op=True)`` through a host buffer (the root's copied first)."""
    if not _staged(buf, stage_cpu):
        return StagedWork([dist.broadcast(buf, src=src, group=group, async_op=True)], [], [], groups, what)
    h = _host_copy(buf)
    if rank == src:
        h.copy_(buf, non_blocking=buf.is_cuda)
        _host_wait([buf])
    work = dist.broadcast(h, src=src, group=group, async_op=True)
    return StagedWork([work], [] if rank == src else [(buf, h)], [h], groups, what)
