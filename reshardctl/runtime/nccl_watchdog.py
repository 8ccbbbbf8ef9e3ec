"""Torch's NCCL watchdog and heartbeat monitor, kept from killing a process for reshardctl's groups.

What torch does (``ProcessGroupNCCL.cpp``, docs/gpu.md "Torch's monitor"): when a work of ANY NCCL group
fails or times out, the group's watchdog writes ``exception_dump`` into the unprefixed root store
(``globalStore_``) and sets a process-wide flag (the static ``shouldDump_``). The heartbeat monitor of
the process's first NCCL group (uid 0: the default group) reacts to either when
``TORCH_NCCL_DUMP_ON_TIMEOUT`` is on (the default): it dumps, then terminates the process (``LOG(FATAL)``)
unless ``TORCH_NCCL_ENABLE_MONITORING`` is off or the group was shut down first. Each setting is read
when a group is created.

* reshardctl's own ranks (``reshardctl run``): ``own_rank_settings`` before the default group exists:
  ``TORCH_NCCL_DUMP_ON_TIMEOUT=0`` (a user's explicit value kept only where it is safe: monitoring off),
  and a short ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (the watchdog sleeps 4x it after a failure before it
  aborts, and a group's destructor joins the watchdog), unless the user set it.
* before a rebuild: ``clear_dump_signal`` deletes the ``exception_dump`` key from the root store, so a
  monitor of the next attempt's groups does not find a failure of the last one.
* under the API the default group is the framework's: ``monitor_risk`` says whether its settings let
  the monitor kill the process after a failure in reshardctl's groups (``api.Refitter`` refuses, or
  warns when asked to).
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
ENABLE_MONITORING = "TORCH_NCCL_ENABLE_MONITORING"
WAIT_TIMEOUT_DUMP_MS = "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"
HEARTBEAT_TIMEOUT_S = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"
DUMP_KEY = "exception_dump"  # ProcessGroupNCCL.hpp: kStoreDumpKey
SHORT_DUMP_WAIT_MS = "1000"  # the watchdog's sleep after a failure: 4 x this (torch's default 15 s -> 60 s)

_TRUE = ("1", "true", "yes", "y")
_FALSE = ("0", "false", "no", "n")


def flag(environ: Mapping[str, str], name: str, default: bool = True) -> bool:
    """A boolean torch variable as torch reads it (``getCvarBool``: 1/true/yes/y, 0/false/no/n, any case;
    unset or unreadable: the default, which is on for both monitor variables)."""
    value = environ.get(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return default


def monitor_can_kill(environ: Mapping[str, str]) -> bool:
    """Would the default group's monitor terminate the process after a failed work of any NCCL group?
    Both the dump reaction (``TORCH_NCCL_DUMP_ON_TIMEOUT``) and the kill (``TORCH_NCCL_ENABLE_MONITORING``)
    are on."""
    return flag(environ, DUMP_ON_TIMEOUT) and flag(environ, ENABLE_MONITORING)


def own_rank_settings(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables to set on reshardctl's own ranks before their default group is created, and a note
    for every explicit user value overridden. A user's ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` is kept when
    monitoring is off (dumps without the kill); with monitoring on it is overridden. Monitoring itself
    is never changed: its watchdog-hang kill (a wedged CUDA call) stays the user's/torch's choice."""
    changes: dict[str, str] = {}
    notes: list[str] = []
    if monitor_can_kill(environ):
        if flag(environ, DUMP_ON_TIMEOUT, default=False) and environ.get(DUMP_ON_TIMEOUT) is not None:
            notes.append(f"{DUMP_ON_TIMEOUT}={environ[DUMP_ON_TIMEOUT]} overridden to 0: with "
                         f"{ENABLE_MONITORING} on, torch's monitor would terminate this rank after a failed "
                         f"refit (set {ENABLE_MONITORING}=0 to keep the dumps)")
        changes[DUMP_ON_TIMEOUT] = "0"
    if environ.get(WAIT_TIMEOUT_DUMP_MS) is None and not flag({**environ, **changes}, DUMP_ON_TIMEOUT):
        changes[WAIT_TIMEOUT_DUMP_MS] = SHORT_DUMP_WAIT_MS
    return changes, notes


def apply_own_rank_settings(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """``own_rank_settings`` written into the environment (this process's by default); the notes."""
    environ = os.environ if environ is None else environ
    changes, notes = own_rank_settings(environ)
    environ.update(changes)
    return notes


def monitor_risk(environ: Mapping[str, str]) -> str | None:
    """Under the API: why the framework's default group would kill this process after a failure in
    reshardctl's groups, or None when its settings are safe."""
    if not monitor_can_kill(environ):
        return None
    heartbeat = environ.get(HEARTBEAT_TIMEOUT_S, "480")
    return (f"torch's NCCL monitor of the default group would terminate this process after a failed refit "
            f"({DUMP_ON_TIMEOUT} and {ENABLE_MONITORING} are on: a failed work of any NCCL group sets torch's "
            f"process-wide dump flag, and the monitor of the default group then terminates the process, "
            f"after up to {HEARTBEAT_TIMEOUT_S}={heartbeat} s)")


def root_store(store):
    """The unprefixed store under ``store`` (torch's ``globalStore_``: where the watchdog writes
    ``exception_dump``), or ``store`` itself when it has no prefix."""
    under = getattr(store, "_underlying_non_prefix_store", None)
    return store if under is None else under


def clear_dump_signal(store) -> bool:
    """Delete ``exception_dump`` from the root store under ``store``; True when a key was there. Best
    effort: an unreachable store (rank 0 gone) answers False."""
    try:
        return bool(root_store(store).delete_key(DUMP_KEY))
    except Exception:  # noqa: BLE001 - rank 0's store is gone: the rebuild fails on its own, clearly
        return False
