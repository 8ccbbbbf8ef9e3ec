"""tests/helpers/spawned_ranks.py: gloo ranks fork from the fork server (torch already imported, no
import paid per rank) and still see the caller's environment as it is at the call, not the server's
from when it started."""

from __future__ import annotations

import os
import resource

from helpers.spawned_ranks import run_ranks


def _rank(rank: int, q) -> None:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    q.put((rank, (os.environ.get("SPAWNED_RANKS_PROBE"), ru.ru_utime + ru.ru_stime), None))


def test_ranks_fork_with_the_callers_environment_of_the_call(monkeypatch):
    monkeypatch.setenv("SPAWNED_RANKS_PROBE", "first")
    run_ranks(_rank, 1, lambda r, _port, q: (r, q))  # the fork server starts here (if not yet), with "first"
    monkeypatch.setenv("SPAWNED_RANKS_PROBE", "second")
    got = run_ranks(_rank, 2, lambda r, _port, q: (r, q))
    assert [got[r][0] for r in range(2)] == ["second", "second"]
    # forked after torch's import: spawned, each rank had used > 2 CPU seconds importing it (0.35 s forked)
    assert all(cpu < 1.5 for _, cpu in got.values()), got
