"""Faults a test sets in its own process on a Refitter's executor (the API itself has no fault hooks)."""

from __future__ import annotations


def corrupt_once(step: int):
    """A byte flipped in what lands on this rank at ``step`` (the executor's tap); a rebuilt Refitter has
    a fresh executor, no tap."""
    done = []

    def tap(at, buf, n):
        if at == step and n > 0 and not done:
            buf[n // 2] ^= 0x5A
            done.append(at)
    return tap
