"""Settling an attempt: every rank says it has left it, through one sealed counter in the run's store,
before any rank builds the next attempt's groups (groups.rebuild); a rank that saw a lost peer says so
and nobody waits for that peer again."""

from __future__ import annotations

import time

from reshardctl.runtime.env import RankEnv
from reshardctl.runtime.run_store import read_sealed, seal


SETTLE_POLL_S = 0.05
_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "timed out", "not complete within",
              "unreachable", "killed by signal", "no report")


def lost_peer(cause: BaseException | str | None) -> bool:
    """Does the failure that ended an attempt say a peer is gone or silent (a closed connection, a reset,
    a timeout, the store unreachable)? Such a peer will not settle: settling need not wait for it."""
    text = str(cause or "").lower()
    return any(w in text for w in _LOST_PEER)


def settle(store, env: RankEnv, attempt: int, timeout_s: float, cause: BaseException | str | None = None,
           poll_s: float = SETTLE_POLL_S) -> list[int]:
    """Every rank says it has left attempt ``attempt``; wait (bounded) until all did. Returns the ranks
    that cannot be counted on (empty: all settled, a rebuild is safe; the same verdict on every rank).

    One counter in the store (``store.add``): a rank arriving adds 1, or, when the failure that ended its
    attempt (``cause``) says a peer is lost (a closed connection, a timeout: ``lost_peer``), ``world + 1``,
    which tells every rank that not every rank will arrive. One store call per poll (``add(key, 0)``
    reads the counter). Settling therefore ends as soon as the outcome is known: all arrived, or one rank
    saw a dead or silent peer (a hung rank that caused a timeout is not waited for again), or the store
    itself is gone (rank 0); ``timeout_s`` only bounds the case where nobody knows. Only at the end are
    the per-rank keys read, to name the ranks: those that did not arrive, else those that saw a lost
    peer. The marks are sealed (``run_store.seal``) and only genuine ones count: an outsider's ``add`` to
    the counter cannot end settling early (it is believed only when the marks agree), and an outsider's
    mark counts for nothing."""
    world = env.world_size
    key = f"settled/{attempt}"
    me = f"{key}/{env.global_rank}"
    lost = lost_peer(cause)
    try:
        store.set(me, seal(store, me, "lost" if lost else "ok"))  # a mark without the run's token: nothing
        n = store.add(key, world + 1 if lost else 1)
        end = time.monotonic() + timeout_s
        while True:
            if n >= world:  # the counter says the outcome is known: the sealed marks must say so too
                marks = {r: read_sealed(store, f"{key}/{r}") for r in range(world)}
                if all(v == "ok" for v in marks.values()):
                    return []
                if any(v == "lost" for v in marks.values()):
                    missing = [r for r, v in marks.items() if v is None]
                    return missing or [r for r, v in marks.items() if v == "lost"]
                # counts without genuine marks: an outsider's add; only the timeout ends it now
            if time.monotonic() >= end:
                break
            time.sleep(poll_s)
            n = store.add(key, 0)
        marks = {r: read_sealed(store, f"{key}/{r}") for r in range(world)}
        missing = [r for r, v in marks.items() if v is None]
        return missing or [r for r, v in marks.items() if v == "lost"]
    except Exception:  # noqa: BLE001 - the store went with rank 0: no retry is possible
        return [0]
