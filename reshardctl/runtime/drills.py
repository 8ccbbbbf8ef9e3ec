"""Fault drills: faults injected on purpose into a ``reshardctl run`` (launcher/worker layer only; the
API never loads this module), so a runbook can show how a failure looks and how fast it is detected.

Spec (``--inject``, repeatable; ``RunOptions.faults`` joins them with ``;``)::

    kill:rank=5:phase=transfer     SIGKILL of the rank when the phase starts (a crashed process)
    exit:rank=3:phase=commit       the rank exits with code 3 when the phase starts (a rank that quits)
    hang:rank=2:phase=verify       the rank sleeps (default 24 h) when the phase starts (alive, silent)
    corrupt:rank=6                 one byte flipped in the first bytes that land on the rank
    slow:rank=1:factor=4           the rank's transfer phase lasts ``factor`` times as long

Keys: ``rank`` (global, required), ``phase`` (defaults: kill/exit/hang ``transfer``/``commit``/``verify``
as above), ``step`` (the refit's training step; default: the first refit that reaches the phase),
``factor`` (slow), ``seconds`` (hang), ``code`` (exit), ``after`` (kill/exit: seconds after the phase
starts, from a timer, while the rank goes on: a fault in the middle of whatever comes next).
Phases, in the order a refit reaches them (the commit's windows: docs/commit-protocol.md):

    connect   the bounded pre-connect after the groups are built (its ``step``: the refit that follows)
    start     the common start of the refit
    transfer  the transfer phase
    verify    the checksum exchange, before the vote
    vote      the vote's result arrived here, before it is forwarded down the tree
    commit    after the vote, before this rank swaps to the new weights
    swapped   after this rank's swap, before the acknowledgement
    ack       the acknowledgement's result arrived here, before it is forwarded down the tree
    done      after the acknowledgement, the refit committed here
    repair    an inference rank enters the failure-time repair (after a failure of the refit)

``key=value`` pairs may be separated by ``:`` or ``,``. Every drill fires once (a retry runs clean),
and writes a ``drill`` event (with its unix time) before it acts: detection times are measured from it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from reshardctl.errors import InputError
from reshardctl.topology import is_trainer

KINDS = ("kill", "exit", "hang", "corrupt", "slow")
PHASES = ("connect", "start", "transfer", "verify", "vote", "commit", "swapped", "ack", "done", "repair")
_DEFAULT_PHASE = {"kill": "transfer", "exit": "commit", "hang": "verify", "corrupt": "transfer", "slow": "transfer"}
_KEYS = {"rank", "phase", "step", "factor", "seconds", "code", "after"}


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    phase: str
    step: int | None = None
    factor: float = 4.0
    seconds: float = 86400.0
    code: int = 3
    after: float = 0.0

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        at += f", {self.after:g} s later" if self.after else ""
        extra = f" x{self.factor:g}" if self.kind == "slow" else ""
        return f"{self.kind}{extra} rank {self.rank} in phase {self.phase}{at}"


def parse_one(spec: str) -> Fault:
    """One drill spec; ``InputError`` (exit 2) naming the spec and what is wrong."""
    kind, _, body = spec.strip().partition(":")
    if kind not in KINDS:
        raise InputError(f"--inject {spec!r}: unknown drill {kind!r}; use one of {', '.join(KINDS)}")
    kv: dict[str, str] = {}
    for part in body.replace(",", ":").split(":"):
        if not part.strip():
            continue
        k, eq, v = part.partition("=")
        if not eq or k.strip() not in _KEYS:
            raise InputError(f"--inject {spec!r}: {part!r} is not one of {', '.join(sorted(_KEYS))} = value")
        kv[k.strip()] = v.strip()
    if "rank" not in kv:
        raise InputError(f"--inject {spec!r}: rank=<global rank> is required")
    phase = kv.get("phase", _DEFAULT_PHASE[kind])
    if phase not in PHASES:
        raise InputError(f"--inject {spec!r}: phase {phase!r} is not one of {', '.join(PHASES)}")
    try:
        f = Fault(kind, int(kv["rank"]), phase, int(kv["step"]) if "step" in kv else None,
                  float(kv.get("factor", 4.0)), float(kv.get("seconds", 86400.0)), int(kv.get("code", 3)),
                  float(kv.get("after", 0.0)))
    except ValueError:
        raise InputError(f"--inject {spec!r}: rank, step and code are integers, factor, seconds and after "
                         f"numbers") from None
    if f.after and f.kind not in ("kill", "exit"):
        raise InputError(f"--inject {spec!r}: after= is for kill and exit drills (a hang stops the rank where it is)")
    if not 0 <= f.after <= 3600:
        raise InputError(f"--inject {spec!r}: after={f.after:g} must be between 0 and 3600 seconds")
    if f.kind == "slow" and f.factor < 1:
        raise InputError(f"--inject {spec!r}: factor {f.factor} must be >= 1")
    return f


def parse_faults(spec: str | None) -> tuple[Fault, ...]:
    return tuple(parse_one(s) for s in (spec or "").split(";") if s.strip())


def check_drills(faults: tuple[Fault, ...], *, world: int, train_world: int, first_step: int,
                 last_step: int) -> None:
    """Refuse (``InputError``, exit 2, before any process starts) a drill that can never fire in this run:
    a rank outside the world, ``corrupt`` on a trainer rank (bytes land only on inference ranks: trainers
    send), a ``step`` outside the run's refits (``first_step``..``last_step``, warm-up included)."""
    for f in faults:
        spec = f.describe()
        if not 0 <= f.rank < world:
            raise InputError(f"--inject: rank {f.rank} is outside the run's {world} ranks (0..{world - 1}): {spec}")
        if f.kind == "corrupt" and is_trainer(f.rank, train_world):
            raise InputError(f"--inject {spec}: rank {f.rank} is a trainer rank (0..{train_world - 1}); trainer ranks "
                             f"only send, so a corrupt drill never fires there: give an inference rank "
                             f"({train_world}..{world - 1})")
        if f.step is not None and not first_step <= f.step <= last_step:
            raise InputError(f"--inject {spec}: step {f.step} is outside the run's refits, steps {first_step}.."
                             f"{last_step} (warm-up included: transports x (warm-up + iterations) refits)")


class Drills:
    """This rank's drills. ``at(phase, step)`` is called by the worker when a phase starts; ``corrupt``
    is the executor's tap on landed bytes; ``slow_factor(step)`` stretches the transfer phase."""

    def __init__(self, faults: tuple[Fault, ...], rank: int, events=None):
        self.mine = [f for f in faults if f.rank == rank]
        self.events = events
        self._done: set[Fault] = set()

    def _fire(self, f: Fault, step: int, phase: str) -> bool:
        if f in self._done or (f.step is not None and f.step != step) or f.phase != phase:
            return False
        self._done.add(f)
        if self.events is not None:
            self.events.record("drill", time.time(), 0.0, kind=f.kind, drill=f.describe(), step=step, at=phase)
            self.events.flush()
        return True

    def at(self, phase: str, step: int) -> None:
        """The rank reached ``phase`` of the refit of ``step``: fire the drills armed for it (a hang
        sleeps in the calling thread: call it from the rank's main thread, see ``hangs``)."""
        for f in self.mine:
            if f.kind in ("kill", "exit", "hang") and self._fire(f, step, phase):
                if f.after:
                    threading.Thread(target=self._act_later, args=(f,), name="reshardctl-drill", daemon=True).start()
                    continue
                self._act(f)

    def hangs(self, phase: str, step: int) -> bool:
        """Will ``at(phase, step)`` hang this rank (so the caller runs that point in its main thread)?"""
        return any(f.kind == "hang" and f not in self._done and f.phase == phase and f.step in (None, step)
                   for f in self.mine)

    def _act_later(self, f: Fault) -> None:
        time.sleep(f.after)
        self._act(f)

    @staticmethod
    def _act(f: Fault) -> None:
        sys.stderr.flush()
        if f.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "exit":
            os._exit(f.code)
        time.sleep(f.seconds)

    def slow_factor(self, step: int) -> float:
        for f in self.mine:
            if f.kind == "slow" and self._fire(f, step, "transfer"):
                return f.factor
        return 1.0

    def corrupt(self, step: int, buf, nbytes: int) -> bool:
        """Flip a byte of ``buf[:nbytes]`` (once); True when it did."""
        if nbytes <= 0:
            return False
        for f in self.mine:
            if f.kind == "corrupt" and f not in self._done and (f.step is None or f.step == step):
                self._done.add(f)
                if self.events is not None:
                    self.events.record("drill", time.time(), 0.0, kind=f.kind, drill=f.describe(), step=step)
                    self.events.flush()
                buf[nbytes // 2] ^= 0x5A
                return True
        return False
