"""The site's active refit transport, as a running job asks for it before each refit.

``LedgerTransport(site)`` is a callable: each call returns the ``Decision`` the site's ledger
(``runbook/ledger.py``) makes now, so a ``reshardctl rollback --site S`` (or ``promote``) in another shell
takes effect at the next refit of a running job, without a restart. ``api.Refitter(transport_source=...)``
calls it on update rank 0 before every refit; ``reshardctl run`` / ``bench`` call it once.

Cost: one ``stat`` of the ledger file per call. The ledger is read (bounded, under its shared lock,
through ``ledger.read_ledger``) only when its ``(st_mtime_ns, st_size, st_ino)`` changed since the last
read: the ledger is only ever appended, so an append changes the size, and a file moved into place
changes the inode.

The decision is ``ledger.active(entries, profile)``: the transport of the last entry that changed the
active transport (a promotion or a rollback), else the profile's ``refit.transport``. ``ledger_entry``
is that entry as ``{"line", "action", "time", "user", "transport"}`` (``line`` counts from 1), None when
the profile's transport rules.

A ledger that cannot be used never stops the job: a corrupt or torn line, a newer ledger version, a file
that cannot be read (a directory or a FIFO in its place, a permission error), or a ledger that was read
once and has disappeared keeps the last good decision, with ``note`` saying why; each distinct problem
is also printed once on stderr (or given to ``warn``). When the very first read fails the profile's
``refit.transport`` is used, with the note. A ledger that has never existed is no problem: nothing was
promoted or rolled back, the profile's transport rules. Only the constructor raises: a profile that
cannot be loaded is a ``ProfileError`` (exit 2), as everywhere else.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from reshardctl.errors import ReshardError
from reshardctl.runbook import ledger
from reshardctl.site import load_profile

_MISSING = ("missing",)  # the stat key of a ledger that does not exist


@dataclass(frozen=True)
class Decision:
    """The transport a refit uses, the ledger entry that made it active (None: the profile's default), and
    ``note``: why the ledger could not be used now (None when it could)."""

    transport: str
    ledger_entry: dict[str, Any] | None
    note: str | None = None

    @property
    def decided_by(self) -> str:
        """``ledger`` (an entry made it active) or ``profile`` (no entry did, or none could be read)."""
        return "profile" if self.ledger_entry is None else "ledger"

    def record(self) -> dict[str, Any]:
        """What a run records of it (summary.json and session.json ``transport_source``)."""
        return {"transport": self.transport, "decided_by": self.decided_by, "ledger_entry": self.ledger_entry,
                "note": self.note}


def flag_record(transport: str) -> dict[str, Any]:
    """``transport_source`` of a run whose transport a flag chose (``--transport``, the validation refit of
    ``rollback --verify``): the ledger was not asked."""
    return {"transport": transport, "decided_by": "flag", "ledger_entry": None, "note": None}


def entry_ref(entries: list[ledger.Entry], entry: ledger.Entry | None) -> dict[str, Any] | None:
    """``entry`` (one of ``entries``) as ``{"line", "action", "time", "user", "transport"}``."""
    if entry is None:
        return None
    line = next(i for i in range(len(entries) - 1, -1, -1) if entries[i] is entry) + 1
    return {"line": line, "action": entry.action, "time": entry.time, "user": entry.user,
            "transport": entry.transport}


def _stderr(text: str) -> None:
    print(f"reshardctl: {text}", file=sys.stderr, flush=True)


class LedgerTransport:
    """``__call__() -> Decision``: the site's active transport now (see the module docstring).

    ``reads`` counts the ledger reads (one per change of the file), ``warn`` receives each distinct
    problem once (default: a line on stderr)."""

    def __init__(self, site: str | os.PathLike, *, warn: Callable[[str], None] | None = None):
        self.profile = load_profile(site)  # ProfileError (exit 2): the one failure a caller sees
        self.path = ledger.ledger_path(self.profile)
        self.reads = 0
        self._warn = warn or _stderr
        self._warned: set[tuple] = set()  # the problems already warned of
        self._key: tuple | None = None  # the stat key of the last call
        self._decision: Decision | None = None  # what the last call returned (for that key)
        self._good: Decision | None = None  # the last decision read from a usable ledger
        self._good_existed = False  # whether that ledger existed (one that disappears since is a problem)

    def __call__(self) -> Decision:
        try:
            st = os.stat(self.path)
            key: tuple = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            key = _MISSING
        except OSError as exc:
            return self._problem(("stat", exc.strerror), f"ledger {self.path} cannot be read: "
                                 f"{exc.strerror or exc}", None)
        if key == self._key and self._decision is not None:
            return self._decision
        if key == _MISSING:
            if self._good_existed:
                return self._problem(("missing",), f"ledger {self.path} has disappeared", key)
            return self._settle(key, Decision(self.profile.refit.transport, None), existed=False)
        try:
            self.reads += 1
            entries = ledger.read_ledger(self.path)
        except (ReshardError, OSError) as exc:
            return self._problem(("read", str(exc).splitlines()[0]), str(exc).splitlines()[0], key)
        transport, entry = ledger.active(entries, self.profile)
        return self._settle(key, Decision(transport, entry_ref(entries, entry)), existed=True)

    def _settle(self, key: tuple, decision: Decision, *, existed: bool) -> Decision:
        self._key, self._decision, self._good, self._good_existed = key, decision, decision, existed
        return decision

    def _problem(self, kind: tuple, text: str, key: tuple | None) -> Decision:
        """The last good decision (else the profile's transport) with ``text`` as its note; ``text``
        warned once per distinct problem. ``key`` None: not cached (the next call stats again)."""
        if self._good is not None:
            base, keeps = self._good, "keeping the last good decision"
        else:
            base, keeps = Decision(self.profile.refit.transport, None), "using the profile's refit.transport"
        note = f"{text}; {keeps}: {base.transport}"
        if kind not in self._warned:
            self._warned.add(kind)
            try:
                self._warn(note)
            except OSError:  # a closed stderr: the note still rides in the decision
                pass
        decision = Decision(base.transport, base.ledger_entry, note)
        self._key, self._decision = key, decision
        return decision


__all__ = ["Decision", "LedgerTransport", "entry_ref", "flag_record"]
