"""Reusable uint8 staging buffers: no allocation or page fault after the first refit, a bounded
reserve, and the high-water mark of what a refit held at once."""

from __future__ import annotations

import weakref

import torch


class BufferPool:
    def __init__(self, device: torch.device, limit_bytes: int | None = None):
        self.device = device
        self.limit = limit_bytes
        self._free: list[torch.Tensor] = []
        self.in_use = 0
        self.peak = 0
        self.reserved = 0
        self._on_free: list[weakref.WeakMethod] = []
        self._ready: dict[int, object] = {}  # CUDA: id(block) -> event after its last use (``release``)

    def notify_on_free(self, method) -> None:
        """Call ``method`` (a bound method, held weakly) whenever the pool is about to let go of blocks,
        so that whoever keeps views of blocks drops them and the memory is really freed."""
        self._on_free.append(weakref.WeakMethod(method))

    def _freeing(self) -> None:
        alive = []
        for ref in self._on_free:
            f = ref()
            if f is not None:
                f()
                alive.append(ref)
        self._on_free = alive

    def acquire(self, n: int) -> torch.Tensor:
        best = None
        for j, b in enumerate(self._free):
            if n <= b.numel() <= 2 * n + 4096 and (best is None or b.numel() < self._free[best].numel()):
                best = j
        if best is not None:
            block = self._free.pop(best)
        else:
            if self.limit is not None:
                self._free.sort(key=lambda b: b.numel())
                if self._free and self.reserved + n > self.limit:
                    self._freeing()
                while self._free and self.reserved + n > self.limit:
                    self.reserved -= self._drop(self._free.pop())
            block = torch.empty(max(n, 8), dtype=torch.uint8, device=self.device)
            self.reserved += block.numel()
            return self._take(block)
        ev = self._ready.pop(id(block), None) if self._ready else None
        if ev is not None:  # the stream that uses it next waits for its last use, on the device
            torch.cuda.current_stream(self.device).wait_event(ev)
        return self._take(block)

    def _take(self, block: torch.Tensor) -> torch.Tensor:
        self.in_use += block.numel()
        self.peak = max(self.peak, self.in_use)
        return block

    def release(self, block: torch.Tensor, ready=None) -> None:
        """``block`` free again; ``ready`` (CUDA): an event recorded after its last use: ``acquire`` makes
        the next user's current stream wait on it, a block let go is waited for by the host first."""
        self.in_use -= block.numel()
        self._free.append(block)
        if ready is not None:
            self._ready[id(block)] = ready

    def _drop(self, block: torch.Tensor) -> int:
        """Let go of a free block (its memory back to torch's allocator, which may hand it out on another
        stream at once): the host waits for the block's own last use first."""
        ev = self._ready.pop(id(block), None) if self._ready else None
        if ev is not None:
            ev.synchronize()
        return block.numel()

    def clear(self) -> None:
        self._freeing()
        self.reserved -= sum(self._drop(b) for b in self._free)
        self._free.clear()
