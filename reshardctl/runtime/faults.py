"""Test-only fault injection, off unless asked for.

Spec (``RunOptions.faults`` or the environment): entries separated by ``;``, each
``<kind>:rank=<global>,step=<n>``. Kinds:

* ``corrupt``: flip one byte of the first non-empty message this rank receives in refit ``step``
  (before the checksums are checked). Env: ``RESHARDCTL_TEST_CORRUPT="rank=5,step=2"``.
* ``die``: the rank exits at once (``os._exit``) when refit ``step`` starts, after the common start.
  Env: ``RESHARDCTL_TEST_DIE="rank=1,step=2"``.
* ``stall``: the rank sleeps ``seconds`` (default 3600) when refit ``step`` starts (a live, silent
  peer). Env: ``RESHARDCTL_TEST_STALL="rank=1,step=2,seconds=30"``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping

KINDS = ("corrupt", "die", "stall")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    seconds: float = 3600.0


def _parse_one(kind: str, body: str) -> Fault:
    kv = dict(part.split("=", 1) for part in body.split(",") if part.strip())
    try:
        return Fault(kind, int(kv["rank"]), int(kv["step"]), float(kv.get("seconds", 3600.0)))
    except (KeyError, ValueError):
        raise ValueError(f"bad fault spec {kind}:{body!r}: want rank=<int>,step=<int>") from None


def parse_faults(spec: str | None, environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    env = os.environ if environ is None else environ
    out = []
    for entry in (spec or "").split(";"):
        if entry.strip():
            kind, _, body = entry.strip().partition(":")
            if kind not in KINDS:
                raise ValueError(f"unknown fault kind {kind!r}: use one of {KINDS}")
            out.append(_parse_one(kind, body))
    for kind in KINDS:
        val = env.get(f"RESHARDCTL_TEST_{kind.upper()}")
        if val:
            out.append(_parse_one(kind, val))
    return tuple(out)


class Faults:
    def __init__(self, faults: tuple[Fault, ...], rank: int):
        self.mine = tuple(f for f in faults if f.rank == rank)
        self._corrupted: set[int] = set()

    def at_step_start(self, step: int) -> None:
        for f in self.mine:
            if f.step == step and f.kind == "die":
                os._exit(17)
            if f.step == step and f.kind == "stall":
                time.sleep(f.seconds)

    def maybe_corrupt(self, step: int, buf, nbytes: int) -> bool:
        """Flip a byte of ``buf[:nbytes]`` once per faulty step; True when it did."""
        if nbytes <= 0 or step in self._corrupted:
            return False
        if any(f.kind == "corrupt" and f.step == step for f in self.mine):
            buf[nbytes // 2] ^= 0x5A
            self._corrupted.add(step)
            return True
        return False
