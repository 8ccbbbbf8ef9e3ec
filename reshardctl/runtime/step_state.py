"""What one step of a rank's program carries between its start and its finish (runtime/executor.py):
the posted works, the staging blocks to release, what landed; the step's message tag; a refit's counts;
a wait's errors named with the step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from reshardctl.errors import TransferError
from reshardctl.runtime.bounded_wait import Abandoned

TAG_ROUND, TAG_GATHER = 0, 1


def step_tag(index: int, kind: int) -> int:
    """The tag of a step's messages: its index and kind (a round, a bucket's gather)."""
    return index * 4 + kind


@dataclass
class ExecStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    wire_bytes: int = 0
    steps: int = 0
    zero_copy_messages: int = 0


@dataclass
class Pending:
    """What ``finish`` needs: the posted works and the buffers to check, unpack and release."""

    kind: str
    index: int
    peers: list[int]
    works: list = field(default_factory=list)
    posted_at: float = 0.0
    posted_unix: float = 0.0
    wire: int = 0
    recvs: list = field(default_factory=list)  # (Link, view, staging block or None)
    blocks: list[torch.Tensor] = field(default_factory=list)  # pool blocks to release
    bucket: tuple | None = None  # (BucketOps, buffer) for a member receiving the broadcast
    span: object = None  # CUDA: the transfer's device-time span (cuda_timing.Span)
    sent_in_place: int = 0  # bytes sent straight from the arena (zero copy)


@contextmanager
def step_errors(p: Pending, what: str) -> Iterator[None]:
    """A wait for step ``p``'s works, its errors said with the step (``where``: kind, index, peers):
    another rank's failure seen by the bounded wait (``Abandoned``) as it is, a failed or aborted
    communicator (``RuntimeError``, ``TransferError``) as ``TransferError("{what} failed: ...")``."""
    where = {"kind": p.kind, "index": p.index, "peers": p.peers}
    try:
        yield
    except Abandoned as exc:
        exc.where = where
        raise
    except (RuntimeError, TransferError) as exc:
        err = TransferError(f"{what} failed: {exc}")
        err.where = where
        raise err from exc
