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
                    self.reserved -= self._free.pop().numel()
            block = torch.empty(max(n, 8), dtype=torch.uint8, device=self.device)
            self.reserved += block.numel()
        self.in_use += block.numel()
        self.peak = max(self.peak, self.in_use)
        return block

    def release(self, block: torch.Tensor) -> None:
        self.in_use -= block.numel()
        self._free.append(block)

    def clear(self) -> None:
        self._freeing()
        self.reserved -= sum(b.numel() for b in self._free)
        self._free.clear()
