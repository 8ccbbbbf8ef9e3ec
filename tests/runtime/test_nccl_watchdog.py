"""Torch's NCCL monitor never kills a process for reshardctl's groups (runtime/nccl_watchdog.py, docs/gpu.md
"Torch's monitor"): the settings of reshardctl's own ranks, the ``exception_dump`` key cleared on a real
TCPStore before a rebuild, the API's check of the framework's settings."""

from __future__ import annotations

import types
import warnings
from datetime import timedelta

import pytest
import torch.distributed as dist

from reshardctl.api import Refitter, check_monitor
from reshardctl.errors import TransferError
from reshardctl.launch.ports import free_port
from reshardctl.runtime import groups as groups_module
from reshardctl.runtime import nccl_watchdog as nw
from reshardctl.runtime.env import RankEnv

DUMP, MON, WAIT = nw.DUMP_ON_TIMEOUT, nw.ENABLE_MONITORING, nw.WAIT_TIMEOUT_DUMP_MS


def test_own_ranks_by_default_turn_the_dump_reaction_off_and_shorten_the_watchdogs_sleep():
    changes, notes = nw.own_rank_settings({})
    assert changes == {DUMP: "0", WAIT: nw.SHORT_DUMP_WAIT_MS} and notes == []
    assert not nw.monitor_can_kill({**changes})


def test_a_users_dump_setting_is_kept_only_where_the_monitor_cannot_kill():
    changes, notes = nw.own_rank_settings({DUMP: "1", MON: "0"})
    assert changes == {} and notes == []  # dumps wanted, monitoring off: safe, kept (and torch's dump wait)
    changes, notes = nw.own_rank_settings({DUMP: "true"})
    assert changes[DUMP] == "0" and len(notes) == 1 and f"{DUMP}=true overridden to 0" in notes[0]
    assert f"{MON}=0" in notes[0]  # says how to keep the dumps


def test_a_users_dump_wait_and_monitoring_are_never_changed():
    env = {WAIT: "30000", MON: "1"}
    changes, _ = nw.own_rank_settings(env)
    assert WAIT not in changes and MON not in changes and changes[DUMP] == "0"
    assert nw.own_rank_settings({DUMP: "0"}) == ({WAIT: nw.SHORT_DUMP_WAIT_MS}, [])


def test_apply_writes_into_the_environment_given():
    env = {DUMP: "yes"}
    notes = nw.apply_own_rank_settings(env)
    assert env[DUMP] == "0" and env[WAIT] == nw.SHORT_DUMP_WAIT_MS and notes


@pytest.mark.parametrize("env, kills", [
    ({}, True), ({DUMP: "0"}, False), ({MON: "0"}, False), ({DUMP: "FALSE"}, False),
    ({DUMP: "1", MON: "1"}, True), ({DUMP: "garbage"}, True),  # unreadable: torch's default (on)
])
def test_when_torchs_monitor_would_kill(env, kills):
    assert nw.monitor_can_kill(env) is kills
    assert (nw.monitor_risk(env) is not None) is kills


def _store():
    port = free_port()
    return dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_the_dump_key_is_deleted_from_the_root_store_under_the_runs_prefixes():
    """The watchdog writes ``exception_dump`` into the unprefixed store (torch's globalStore_); reshardctl
    holds the run's store behind prefixes."""
    tcp = _store()
    run = dist.PrefixStore("run-abc/", tcp)
    tcp.set(nw.DUMP_KEY, "\x03\x00\x00\x00")
    run.set(nw.DUMP_KEY, "a key of the run's own, not torch's")
    assert nw.clear_dump_signal(dist.PrefixStore("attempt-0/", run)) is True
    assert not tcp.check([nw.DUMP_KEY]) and run.check([nw.DUMP_KEY])
    assert nw.clear_dump_signal(run) is False  # nothing left to delete


def test_rebuild_clears_the_dump_key_then_builds_the_next_attempt(tmp_path):
    """``groups.rebuild`` on a real one-rank gloo world over a real TCPStore."""
    tcp = _store()
    store = dist.PrefixStore("run-x/", tcp)
    env = RankEnv(0, 1, 0, "train", 0, "127.0.0.1", tcp.port, "gloo")
    plan = types.SimpleNamespace(broadcast_groups=lambda: [])
    g = groups_module.init_groups(env, plan, store, 10.0)
    try:
        tcp.set(nw.DUMP_KEY, "x")
        g2 = groups_module.rebuild(g, plan, store, 10.0)
        assert g2.attempt == 1 and not tcp.check([nw.DUMP_KEY])
    finally:
        groups_module.shutdown()


def test_the_api_refuses_or_warns_on_unsafe_framework_settings():
    with pytest.raises(TransferError) as info:
        check_monitor("nccl", {})
    assert f"{DUMP}=0" in str(info.value) and "terminate this process" in str(info.value)
    with pytest.warns(RuntimeWarning, match="terminate this process"):
        check_monitor("nccl", {DUMP: "1"}, "warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_monitor("nccl", {DUMP: "0"})
        check_monitor("nccl", {MON: "0"})
        check_monitor("gloo", {})  # no NCCL group of reshardctl's: nothing to kill for


def test_the_refitter_refuses_before_building_any_group(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        monkeypatch.delenv(DUMP, raising=False)
        monkeypatch.delenv(MON, raising=False)
        monkeypatch.setattr("reshardctl.api.data_plane_backend", lambda name: "nccl")
        before = len(dist.distributed_c10d._world.pg_map)
        with pytest.raises(TransferError, match="Refitter refused"):
            Refitter(types.SimpleNamespace(train_world=1, infer_world=0))
        assert len(dist.distributed_c10d._world.pg_map) == before
        with pytest.raises(TransferError, match="unsafe_monitor"):
            Refitter(types.SimpleNamespace(train_world=1, infer_world=0), unsafe_monitor="ignore")
    finally:
        dist.destroy_process_group()
