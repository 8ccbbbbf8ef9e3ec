"""One reusable, bounded pinned host buffer for host -> GPU copies (checkpoint slices to the device).

``tensor.pin_memory()`` per tensor pins a fresh block each time, and torch's caching host allocator
keeps every such block for reuse: reading a checkpoint box by box that way pins (and keeps) as much
host memory as the boxes together. Here one buffer of ``capacity`` bytes (``DEFAULT_BYTES`` = 256 MiB,
or ``RESHARDCTL_PINNED_POOL_MB``) is pinned once and split in ``slots`` (2) equal slots; a host tensor
is copied in chunks of one slot:

    for chunk k:  wait for slot k % 2's previous H2D (its CUDA event)   <- host sync, bounds the memory
                  host memcpy  src[chunk] -> slot                         (overlaps slot k-1's DMA)
                  H2D  slot -> dst[chunk], non_blocking, on ``stream``   (cudaMemcpyAsync from pinned)
                  record slot's event on ``stream``

Ordering: every H2D is enqueued on ``stream`` (default: the current stream of ``dst``'s device), so
work enqueued later on that stream sees ``dst`` complete without any host sync; work on OTHER streams
must wait for it (``other.wait_stream(stream)`` or an event), as everywhere in the runtime
(docs/gpu.md). When ``copy_`` returns, ``src`` may be freed or changed (its bytes are in the staging
buffer or on the device); the staging slots are reused only after their events completed. Pinned
memory used: ``capacity`` bytes, once, whatever the number and size of the copies.

On CPU (``dst`` on the CPU, or no CUDA) ``to_device`` is a plain copy; ``copy_(..., always_stage=True)``
runs the same chunk loop through an unpinned buffer, so the chunking is tested on machines without a GPU.
One pool serves one thread at a time (a lock guards it).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

DEFAULT_BYTES = 256 << 20
ENV_MB = "RESHARDCTL_PINNED_POOL_MB"
ALIGN = 512  # chunk sizes are multiples of this (DMA-friendly, any dtype's element boundary)


def default_capacity(environ=None) -> int:
    """``RESHARDCTL_PINNED_POOL_MB`` (MiB, > 0) when set, else ``DEFAULT_BYTES``."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MB, "").strip()
    if not raw:
        return DEFAULT_BYTES
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_MB}={raw!r} is not a number of MiB") from None
    if not mb > 0:
        raise ValueError(f"{ENV_MB}={raw!r}: the pinned pool needs a positive size")
    return int(mb * (1 << 20))


@dataclass
class PoolStats:
    copies: int = 0
    chunks: int = 0
    bytes: int = 0
    host_waits: int = 0  # times a slot's previous H2D was waited for (the bound at work)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(1) if t.dim() == 0 else t
    if not t.is_contiguous():
        raise ValueError("the pinned pool copies contiguous tensors")
    return t.view(-1).view(torch.uint8)


class PinnedStagingPool:
    """A bounded staging buffer for host -> device copies (see the module)."""

    def __init__(self, capacity_bytes: int | None = None, *, slots: int = 2):
        cap = default_capacity() if capacity_bytes is None else int(capacity_bytes)
        if slots < 1:
            raise ValueError("the pinned pool needs at least one slot")
        chunk = (cap // slots) // ALIGN * ALIGN
        if chunk <= 0:
            raise ValueError(f"pinned pool of {cap} bytes: below {slots} x {ALIGN} bytes")
        self.capacity = cap
        self.slots = slots
        self.chunk = chunk
        self.stats = PoolStats()
        self._buf: torch.Tensor | None = None
        self._pinned = False
        self._events: list = [None] * slots  # per slot: the CUDA event recorded after the H2D that read it
        self._lock = threading.Lock()

    @property
    def allocated_bytes(self) -> int:
        """Host bytes this pool holds (pinned or not): at most ``capacity``."""
        return 0 if self._buf is None else self._buf.numel()

    @property
    def pinned(self) -> bool:
        return self._buf is not None and self._pinned

    def _drain(self) -> None:
        for ev in self._events:
            if ev is not None:
                ev.synchronize()
        self._events = [None] * self.slots

    def _staging(self, pin: bool) -> torch.Tensor:
        if self._buf is None or (pin and not self._pinned):
            self._drain()  # no H2D may still read the buffer being dropped
            self._buf = None
            self._buf = torch.empty(self.slots * self.chunk, dtype=torch.uint8, pin_memory=pin)
            self._pinned = pin
        return self._buf

    def to_device(self, src: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """``src`` (a host tensor) on ``device``: a new contiguous tensor filled through the pool on the
        device's current stream; on the CPU, ``src.to(device)`` (no staging)."""
        device = torch.device(device)
        if device.type != "cuda" or src.device.type != "cpu":
            return src.to(device)
        dst = torch.empty(src.shape, dtype=src.dtype, device=device)
        return self.copy_(dst, src)

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, stream=None, always_stage: bool = False) -> torch.Tensor:
        """``dst <- src`` (same dtype and number of elements; ``dst`` contiguous). A host ``src`` into a
        CUDA ``dst`` goes through the pinned slots, ordered on ``stream`` (default: the current stream of
        ``dst``'s device; another stream of that device must already wait for whatever last used
        ``dst``'s memory). Anything else is a plain ``copy_``, unless ``always_stage`` (the same chunk
        loop through an unpinned buffer: the CPU tests). Returns ``dst``."""
        if src.dtype != dst.dtype or src.numel() != dst.numel():
            raise ValueError(f"pinned pool copy: {src.dtype} x {src.numel()} into {dst.dtype} x {dst.numel()}")
        cuda = dst.device.type == "cuda" and src.device.type == "cpu"
        if not cuda and not (always_stage and src.device.type == "cpu" and dst.device.type == "cpu"):
            dst.copy_(src.reshape(dst.shape))
            return dst
        s = _flat_bytes(src if src.is_contiguous() else src.contiguous())
        d = _flat_bytes(dst)
        n = s.numel()
        with self._lock:
            self.stats.copies += 1
            if n == 0:
                return dst
            buf = self._staging(pin=cuda)
            if cuda:
                current = torch.cuda.current_stream(d.device)
                if stream is None:
                    stream = current
                elif stream.device != d.device:
                    raise ValueError(f"pinned pool copy into {d.device} on a stream of {stream.device}")
                elif stream != current:
                    # dst was allocated on the current stream: the allocator must not reuse its memory
                    # before this stream's copies ran (the caller made ``stream`` wait for ``current``)
                    dst.record_stream(stream)
            for k, off in enumerate(range(0, n, self.chunk)):
                m = min(self.chunk, n - off)
                slot = k % self.slots
                stage = buf[slot * self.chunk : slot * self.chunk + m]
                ev = self._events[slot]
                if ev is not None:  # the H2D that last read this slot must be done before it is refilled
                    ev.synchronize()
                    self._events[slot] = None
                    self.stats.host_waits += 1
                stage.copy_(s[off : off + m])  # host memcpy (pageable -> pinned)
                if cuda:
                    with torch.cuda.stream(stream):
                        d[off : off + m].copy_(stage, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    self._events[slot] = ev
                else:
                    d[off : off + m].copy_(stage)
                self.stats.chunks += 1
                self.stats.bytes += m
        return dst

    def synchronize(self) -> None:
        """Wait for every H2D still reading the staging buffer (not needed for ordering on ``stream``)."""
        with self._lock:
            self._drain()

    def close(self) -> None:
        """Release the buffer (after its copies completed)."""
        with self._lock:
            self._drain()
            self._buf = None
            self._pinned = False


_shared: list[PinnedStagingPool] = []
_shared_lock = threading.Lock()


def shared_pool() -> PinnedStagingPool:
    """This process's pool (``default_capacity()``), made on first use."""
    with _shared_lock:
        if not _shared:
            _shared.append(PinnedStagingPool())
        return _shared[0]
