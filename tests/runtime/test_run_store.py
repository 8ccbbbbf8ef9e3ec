"""The run's store against an outsider: a process that knows the store's address and port (from the
run directory's events) but not the run token, while a real 4-rank gloo run is mid-refit
(``store_attacker.py``). It cannot connect on another interface of a local run, finds nothing in the
store derived from the token in a usable form, cannot stop the run with forged failure records (raw,
under the former scheme's prefix, or under every namespace it lists), and cannot join the run's groups
on the former scheme's prefix; the run commits every refit. In-process: records and settle marks with
a wrong seal count for nothing, and a genuine record is not believed under another name."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from reshardctl.launch.local import run_local
from reshardctl.launch.ports import free_port
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.env import make_rank_env
from reshardctl.runs.records import read_events
from reshardctl.runtime import nccl_watchdog as nw
from reshardctl.runtime.groups import Groups, init_groups, rebuild, rendezvous, shutdown
from reshardctl.runtime.settle import settle
from reshardctl.runtime.run_store import RunKeys, SealError, for_torch, scoped

from helpers.runtime_plans import p2p_plan, rows_cols_case
from helpers.store_attacker import other_address

TOKEN = "d3adb33f" * 4
HANG_S = 8.0  # rank 1 pauses this long at step 2 (below the timeout): the outsider acts meanwhile


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("attacked")
    other = other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    out = run_dir.parent / "attacker.json"
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    world = plan.train_world + plan.infer_world
    attacker = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "helpers" / "store_attacker.py"), str(run_dir),
                                 str(out), other, str(world)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        opts = RunOptions(run_dir=str(run_dir), timeout_s=30.0, device="cpu", iterations=3, token=TOKEN,
                          faults=f"hang:rank=1:phase=transfer:step=2:seconds={HANG_S}")
        try:
            reports, error = run_local(plan, opts), None
        except Exception as exc:  # noqa: BLE001 - asserted by the tests
            reports, error = getattr(exc, "reports", []), exc
        log = attacker.communicate(timeout=120)[0].decode()
    finally:
        if attacker.poll() is None:
            attacker.kill()
    assert out.exists(), log
    return {"res": json.loads(out.read_text()), "reports": reports, "error": error, "run_dir": run_dir,
            "world": world, "other": other}


def commits(run_dir: Path, world: int) -> list[dict]:
    return [e for r in range(world) for e in read_events(run_dir / "events" / f"rank-{r}.jsonl")
            if e["phase"] == "commit" and "error" not in e]


def test_the_run_commits_every_refit_despite_the_outsider(attacked):
    assert attacked["error"] is None, str(attacked["error"])
    assert len(attacked["reports"]) == attacked["world"] and all(r.ok for r in attacked["reports"])


def test_a_local_store_listens_on_loopback_only(attacked):
    res = attacked["res"]
    assert res["loopback_connect"]["ok"], res  # the outsider had the right port
    assert not res["other_interface_connect"]["ok"], (attacked["other"], res["other_interface_connect"])
    assert "refused" in res["other_interface_connect"]["error"].lower()


def test_nothing_in_the_store_reveals_the_token(attacked):
    res = attacked["res"]
    assert not res["old_digest"]["ok"], res["old_digest"]  # no digest under the former key
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert res["values"], res["keys"]  # the outsider did read the store
    for key, value in res["values"].items():
        for secret in (TOKEN, digest, digest[:16]):
            assert secret not in key and secret not in (value or ""), key
    assert not any(k.startswith(f"run-{digest[:16]}") for k in res["values"])  # not the former prefix


def test_forged_failure_records_do_not_stop_the_run(attacked):
    res, run_dir, world = attacked["res"], attacked["run_dir"], attacked["world"]
    forged = {f["target"] for f in res["forged"] if f["ok"]}
    assert "raw" in forged and any(t.startswith("seen ") for t in forged), res["forged"]
    # written while every rank still had a refit's waits ahead (they poll the record in every wait)
    done = commits(run_dir, world)
    assert res["forged_at"] < min(max(e["start"] for e in done if e["rank"] == r) for r in range(world))
    assert attacked["error"] is None and all(r.ok for r in attacked["reports"])
    assert len(done) == 3 * world  # 3 refits, every rank committed each


def test_an_outsider_cannot_join_the_runs_groups_on_the_former_prefix(attacked):
    res = attacked["res"]
    assert not res["init_old_prefix"]["ok"], res["init_old_prefix"]
    assert attacked["error"] is None


# ---- during group creation: torch's own records ---------------------------------------------------------
SETUP_TIMEOUT_S = 10.0


def _setup_rank(rank: int, world: int, port: int, go: str, out: str) -> None:
    """A rank of a run that only builds its groups (``rendezvous``, ``init_groups``) and checks them with an
    all-reduce; the last rank starts its group creation only once the outsider is done (``go``). Writes
    ``rank-N.json``: ok and the sum, or the error, and when it ended; rank 0 (the store) waits for all."""
    import os

    import torch

    env = make_rank_env(rank, world // 2, world - world // 2, "127.0.0.1", port)
    store = rendezvous(env, 30, token=TOKEN)
    if rank == world - 1:
        end = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < end:
            time.sleep(0.05)
    res: dict = {"rank": rank}
    try:
        groups = init_groups(env, [], store, SETUP_TIMEOUT_S)
        x = torch.ones(1)
        dist.all_reduce(x, group=groups.ctrl)
        res.update(ok=True, sum=x.item())
    except Exception as exc:  # noqa: BLE001 - asserted by the tests
        res.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    res["end"] = time.time()
    Path(out, f"rank-{rank}.json").write_text(json.dumps(res))
    if rank == 0:  # the store lives in this process: keep it until every rank wrote its result
        end = time.monotonic() + SETUP_TIMEOUT_S + 30
        while len(list(Path(out).glob("rank-*.json"))) < world and time.monotonic() < end:
            time.sleep(0.1)
    os._exit(0)


def attack_setup(tmp_path: Path, mode: str, world: int = 4) -> dict:
    """4 ranks build their groups while an outsider (``store_attacker.py join|overwrite``: the port, not
    the token) acts on the run's store; every rank's result, the outsider's, and when it let the last
    rank go."""
    import multiprocessing as mp

    port = free_port()
    go, stop, out = tmp_path / "go", tmp_path / "stop", tmp_path / "outsider.json"
    outsider = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "helpers" / "store_attacker.py"), mode, str(port),
                                 str(world), str(go), str(stop), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ctx = mp.get_context("spawn")
    ranks = [ctx.Process(target=_setup_rank, args=(r, world, port, str(go), str(tmp_path))) for r in range(world)]
    killed = []
    try:
        for p in ranks:
            p.start()
        end = time.monotonic() + 120
        while not go.exists() and time.monotonic() < end:
            time.sleep(0.05)
        # as the launchers do: a rank that reported a failure gives the others timeout + 5 s, then they go
        end, cut = time.monotonic() + 2 * SETUP_TIMEOUT_S + 30, None
        while any(p.is_alive() for p in ranks) and time.monotonic() < (cut or end):
            if cut is None and any(not json.loads(f.read_text())["ok"] for f in tmp_path.glob("rank-*.json")):
                cut = time.monotonic() + SETUP_TIMEOUT_S + 5
            time.sleep(0.1)
        killed = [r for r, p in enumerate(ranks) if p.is_alive()]
        stop.touch()
        log = outsider.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        for p in ranks:
            if p.is_alive():
                p.kill()
        if outsider.poll() is None:
            outsider.kill()
    assert out.exists(), log
    results = {}
    for r in range(world):
        f = tmp_path / f"rank-{r}.json"
        if f.exists():
            results[r] = json.loads(f.read_text())
        else:  # ended by the rule above, or gone without a result (a launcher reports it lost)
            why = "killed (as by the launcher)" if r in killed else f"exited {ranks[r].exitcode} without a result"
            results[r] = {"ok": False, "error": why}
    return {"outsider": json.loads(out.read_text()), "ranks": results, "go": go.stat().st_mtime, "world": world}


def test_an_outsider_cannot_join_the_group_creation_as_the_missing_rank(tmp_path):
    """The outsider lists the keys, finds the run's namespace and attempt, and calls ``init_process_group``
    there as the rank that has not arrived yet: it finds nothing to join (torch's records are sealed under
    opaque names), and the run's own ranks build their groups and agree."""
    got = attack_setup(tmp_path, "join")
    outsider, world = got["outsider"], got["world"]
    assert outsider["keys"], outsider  # it did see the run's namespace
    assert not outsider["join"]["ok"], outsider["join"]  # before the fix: "joined" (a stand-in for rank 3)
    assert outsider["connections"] == 0
    for r, res in got["ranks"].items():
        assert res["ok"] and res["sum"] == world, (r, res)
        assert res["end"] - got["go"] < SETUP_TIMEOUT_S + 5, (r, res)


def test_an_overwritten_address_record_is_refused_not_connected_to(tmp_path):
    """The outsider rewrites every record it lists in the run's namespace (gloo's address records among
    them) to point at its own socket, then the last rank builds its groups: no rank connects to the
    outsider; the last rank, which reads the rewritten records, fails with the wrong-seal error within
    the timeout; the others, waiting for it inside torch, fail or are ended as the launchers end them
    (timeout + 5 s after a rank's failure report)."""
    got = attack_setup(tmp_path, "overwrite")
    outsider, ranks, world = got["outsider"], got["ranks"], got["world"]
    assert len(outsider["overwritten"]) >= world - 1, outsider  # every present rank's record rewritten
    assert outsider["connections"] == 0, outsider  # before the fix: the last rank connected to it
    late = ranks[world - 1]
    assert not late["ok"] and "wrong seal" in late["error"], late  # the root cause, named
    assert late["end"] - got["go"] < SETUP_TIMEOUT_S + 5, late
    for r, res in ranks.items():  # no group was built with the outsider in it
        assert not res["ok"], (r, res)


# ---- in-process: seals ----------------------------------------------------------------------------------
@pytest.fixture
def run_store():
    port = free_port()
    env = make_rank_env(0, 1, 1, "127.0.0.1", port)
    store = rendezvous(env, 10, token=TOKEN)
    raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    return env, store, raw


def test_a_failure_record_with_a_wrong_seal_is_ignored_and_overwritten(run_store, capsys):
    env, store, raw = run_store
    prefix = RunKeys.from_token(TOKEN).prefix
    g = Groups(env, None, timedelta(seconds=5), store=scoped(store, "attempt-0/ctl/"))
    raw.set(f"{prefix}/attempt-0/ctl//failed", "rank 3 failed: forged")
    assert raw.check([f"{prefix}/attempt-0/ctl//failed"])  # the outsider's record is where ranks look
    assert g.failure() is None and g.forged
    assert "wrong seal" in capsys.readouterr().err
    g.publish_failure("rank 0 failed: real")  # the forged record held the slot: overwritten
    assert g.failure() == "rank 0 failed: real"
    # a genuine record of attempt 0 is not believed under attempt 1's name
    g1 = Groups(env, None, timedelta(seconds=5), store=scoped(store, "attempt-1/ctl/"))
    raw.set(f"{prefix}/attempt-1/ctl//failed", raw.get(f"{prefix}/attempt-0/ctl//failed"))
    assert g1.failure() is None


def test_settle_marks_with_a_wrong_seal_count_for_nothing(run_store):
    env, store, raw = run_store
    prefix = RunKeys.from_token(TOKEN).prefix
    raw.set(f"{prefix}/settled/0/1", "1")  # rank 1 never settled: an outsider says it did
    assert settle(store, env, 0, 0.3) == [1]
    peer = rendezvous(make_rank_env(1, 1, 1, "127.0.0.1", env.master_port), 10, token=TOKEN)
    peer.set("settled/0/1", raw.get(f"{prefix}/settled/0/0"))  # rank 0's genuine mark, replayed as rank 1's
    assert settle(store, env, 0, 0.3) == [1]
    assert settle(peer, make_rank_env(1, 1, 1, "127.0.0.1", env.master_port), 0, 5) == []


def test_rank_0_listens_on_the_rendezvous_address_only():
    other = other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = free_port()
    rendezvous(make_rank_env(0, 1, 1, "127.0.0.1", port), 10, token=TOKEN)
    with socket.socket() as s:
        s.bind((other, port))  # raises EADDRINUSE when the store listens on 0.0.0.0 / ::


def test_torchs_records_are_stored_sealed_under_opaque_names(run_store):
    """What torch's groups see (``for_torch``): values round-trip; the raw store holds neither the name nor
    the value in the clear; a value an outsider writes, or a genuine one copied under another name, is
    refused on read with the wrong-seal error; ``compare_set`` keeps torch's semantics."""
    env, store, raw = run_store
    t = for_torch(store)
    assert for_torch(store) is t  # one per run store, kept alive on it (torch holds only the C++ side)
    t.set("attempt-0//0//cpu//0/1", b"\x02\x00gloo-address-of-rank-1")
    assert t.get("attempt-0//0//cpu//0/1") == b"\x02\x00gloo-address-of-rank-1"
    listed = [k for k in raw.list_keys() if k.startswith("run-")]
    assert listed and not any("attempt" in k or "cpu" in k for k in listed), listed
    assert not any(b"gloo-address" == raw.get(k)[:12] for k in listed)
    opaque = RunKeys.from_token(TOKEN).prefix + "/" + t.name("attempt-0//0//cpu//0/1")
    assert raw.check([opaque])
    raw.set(opaque, b"\x00" * 32 + b"\x02\x00an-outsider's-address")
    with pytest.raises(SealError, match="wrong seal"):
        t.get("attempt-0//0//cpu//0/1")
    t.set("attempt-0//0//cpu//0/2", b"rank 2")
    raw.set(opaque, raw.get(RunKeys.from_token(TOKEN).prefix + "/" + t.name("attempt-0//0//cpu//0/2")))
    with pytest.raises(SealError):  # rank 2's genuine record replayed as rank 1's
        t.get("attempt-0//0//cpu//0/1")
    assert t.compare_set("cas", "", "first") == b"first"
    assert t.compare_set("cas", "other", "second") == b"first"
    assert t.compare_set("cas", "first", "second") == b"second"
    assert t.multi_get(["cas", "attempt-0//0//cpu//0/2"]) == [b"second", b"rank 2"]
    assert t.add("counter", 2) == 2 and t.add("counter", 0) == 2
    assert t.check(["cas"]) and not t.check(["never-set"])
    assert t.delete_key("cas") and not t.check(["cas"])


def test_rebuild_clears_torchs_dump_key_in_the_sealed_store():
    """torch's NCCL watchdog writes ``exception_dump`` into the store under all prefixes, here the sealed
    store: ``rebuild`` deletes it there (nccl_watchdog.clear_dump_signal) before the next attempt. A real
    one-rank gloo world."""
    env = make_rank_env(0, 1, 0, "127.0.0.1", free_port())
    store = rendezvous(env, 10, token=TOKEN)
    g = init_groups(env, [], store, 10.0)
    try:
        for_torch(store).set(nw.DUMP_KEY, b"\x03\x00\x00\x00")
        g2 = rebuild(g, [], store, 10.0)
        assert g2.attempt == 1 and not for_torch(store).check([nw.DUMP_KEY])
    finally:
        shutdown()
