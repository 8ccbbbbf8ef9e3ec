"""Which transport a Refitter's next refit runs: update rank 0 asks its transport source (the site's
ledger: runbook/transport_source.py) and sends ``(transport, ledger entry)`` to every rank over the
control group before any byte moves, so both sides always run the same plan (docs/api.md)."""

from __future__ import annotations

import json
import warnings
from typing import Callable, Iterable

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.runtime.bounded_wait import wait_works

DECISION_BYTES = 1024  # one control-plane broadcast carries update rank 0's decision; longer ones take two


class DecisionChannel:
    """Update rank 0's transport source, heard by every rank. ``source`` is called on rank 0 only (a
    callable returning ``.transport``, ``.ledger_entry``, ``.note``); ``transports``: the transports this
    rank has plans for (a decision naming another fails the refit on every rank, before any byte moves)."""

    def __init__(self, source: Callable, transports: Iterable[str], rank: int, timeout_s: float):
        self.source, self.transports = source, tuple(transports)
        self.rank, self.timeout_s = rank, timeout_s
        self._noted: str | None = None

    def receive(self, step: int, groups) -> tuple[str, dict | None]:
        """Update rank 0's decision on every rank: one broadcast over the control group of a fixed-size
        buffer (its length, then its JSON), a second one only for a decision longer than that; each wait
        bounded by ``timeout_s`` through ``wait_works`` (a rank 0 that dies here is not drilled: the
        control group's gloo timeout is what would end the wait)."""
        payload = b""
        if self.rank == 0:
            payload = json.dumps(self._ask(), default=str).encode()
        head = torch.zeros(DECISION_BYTES, dtype=torch.uint8)
        if payload:
            head[:8] = torch.tensor([len(payload)], dtype=torch.int64).view(torch.uint8)
            first = payload[:DECISION_BYTES - 8]
            head[8:8 + len(first)] = torch.frombuffer(bytearray(first), dtype=torch.uint8)
        self._broadcast(head, groups)
        n = int(head[:8].view(torch.int64).item())
        data = bytes(head[8:8 + n].numpy())
        if n > DECISION_BYTES - 8:  # a long ledger entry: the rest in a second broadcast
            rest = torch.empty(n - len(data), dtype=torch.uint8)
            if payload:
                rest.copy_(torch.frombuffer(bytearray(payload[len(data):]), dtype=torch.uint8))
            self._broadcast(rest, groups)
            data += bytes(rest.numpy())
        got = json.loads(data.decode())
        if "error" in got:
            raise TransferError(f"refit of step {step} not started (nothing moved): {got['error']}")
        return got["transport"], got["ledger_entry"]

    def _broadcast(self, t: torch.Tensor, groups) -> None:
        wait_works([dist.broadcast(t, src=0, group=groups.ctrl, async_op=True)], groups,
                   self.timeout_s, "transport decision", device=False)

    def _ask(self) -> dict:
        """Update rank 0: its transport source's decision, as sent to every rank. A note (the ledger could
        not be read: the last good decision stands) is warned once per distinct note."""
        try:
            d = self.source()
            transport, entry, note = d.transport, d.ledger_entry, d.note
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it, not hang in the broadcast
            return {"error": f"the transport source of update rank 0 failed: {type(exc).__name__}: {exc}"}
        if note and note != self._noted:
            self._noted = note
            warnings.warn(f"reshardctl: transport source: {note}", RuntimeWarning, stacklevel=5)
        if transport not in self.transports:
            return {"error": f"the transport source named transport {transport!r}; this Refitter has plans "
                             f"for {', '.join(self.transports)}"}
        return {"transport": transport, "ledger_entry": None if entry is None else dict(entry)}
