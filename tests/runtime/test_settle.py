"""Settling before a retry (runtime/groups.py ``settle``): on a real TCPStore, one store call per poll, and
it ends as soon as the outcome is known (all arrived, or a rank saw a lost peer), not at the timeout;
end to end, ``--retries 1`` keeps a kill's detection time (real gloo ranks)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from reshardctl.errors import TransferError
from reshardctl.launch.local import run_local
from reshardctl.launch.ports import free_port
from reshardctl.runtime.settle import lost_peer, settle

from helpers.runtime_plans import p2p_plan, rows_cols_case
from helpers.fault_drills import drill_time, opts, survivors_detect_within_bound


class CountingStore:
    """A real store; every call counted."""

    def __init__(self, store):
        self._store, self.calls = store, 0

    def __getattr__(self, name):
        fn = getattr(self._store, name)

        def counted(*a, **kw):
            self.calls += 1
            return fn(*a, **kw)
        return counted


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=timedelta(seconds=10),
                      wait_for_workers=False)
    return dist.PrefixStore("t/", s)


def env(rank, world):
    return SimpleNamespace(global_rank=rank, world_size=world)


def test_one_store_call_per_poll_however_many_ranks_are_missing(store):
    counting = CountingStore(store)
    poll, timeout = 0.02, 0.6
    t = time.monotonic()
    missing = settle(counting, env(0, 8), 0, timeout, poll_s=poll)  # ranks 1..7 never arrive
    polls = (time.monotonic() - t) / poll
    assert missing == list(range(1, 8))
    # set + add at arrival, one add per poll, then 8 checks naming the missing ranks once at the end
    assert counting.calls <= polls + 2 + 8 + 1, (counting.calls, polls)


def test_all_arrived_ends_at_once(store):
    out = {}

    def rank(r, delay):
        time.sleep(delay)
        out[r] = settle(store, env(r, 3), 0, 30.0)

    ths = [threading.Thread(target=rank, args=(r, 0.1 * r)) for r in range(3)]
    t = time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert out == {0: [], 1: [], 2: []}
    assert time.monotonic() - t < 30.0 / 4


def test_a_lost_peer_ends_settling_on_every_rank_at_once(store):
    """Rank 1 failed on a closed connection: ranks 0 and 1 stop at once (rank 2, dead, never arrives),
    and the verdict is the same on both."""
    out = {}

    def rank(r, cause):
        out[r] = (settle(store, env(r, 3), 0, 30.0, cause=cause), time.monotonic())

    t = time.monotonic()
    ths = [threading.Thread(target=rank, args=(0, "Abandoned: rank 1 failed")),
           threading.Thread(target=rank, args=(1, RuntimeError("Connection closed by peer [127.0.0.1]:1234")))]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert out[0][0] == out[1][0] == [2]
    assert max(e for _, e in out.values()) - t < 30.0 / 4


@pytest.mark.parametrize("text,lost", [
    ("Connection closed by peer [127.0.0.1]:5", True), ("Timed out waiting 5000ms for recv operation", True),
    ("the commit vote: not complete within 5 s", True), ("checksum mismatch: round 0 from rank 0", False)])
def test_lost_peer_reads_the_failure(text, lost):
    assert lost_peer(text) is lost


def test_a_kill_with_a_retry_is_detected_as_fast_as_without(tmp_path):
    """--retries 1 and a dead rank: the survivors settle within a fraction of the timeout (they used to
    wait the full timeout for the dead rank), then stop without a retry."""
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    timeout = 5.0
    with pytest.raises(TransferError) as info:
        run_local(plan, opts(tmp_path, timeout_s=timeout, retries=1, faults="kill:rank=3:phase=transfer:step=2"))
    err = info.value
    assert err.failures[0]["rank"] == 3
    assert any("no retry" in (f.get("message") or "") for f in err.failures[1:])
    survivors_detect_within_bound(err, drill_time(tmp_path, 3), timeout / 2)
