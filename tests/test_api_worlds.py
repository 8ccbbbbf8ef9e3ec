"""Two worlds joined by an update group (api.UpdateGroup): real gloo processes, real bytes.

Trainer processes and inference processes each initialise torch.distributed on their own (their own
TCPStore, their own port, world 2 each), as NeMo RL / OpenRLHF / verl run them; the Refitter joins them
through reshardctl's update world (runtime/update_world.py) at a third address, with the run's token. A
fifth process without the token tries to join. Every byte an inference rank ends up with is checked
against the synthetic generator, independently of the runtime's checksums.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from reshardctl import api
from reshardctl.errors import ReshardError, TransferError
from reshardctl.launch.ports import free_port
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.executor_taps import corrupt_once
from helpers.small_llama import SMALL_LLAMA as SMALL
from helpers.spawned_ranks import run_ranks

TOKEN = "the-run-token"


@dataclass(frozen=True)
class Decision:  # the contract's runbook.transport_source.Decision: the Refitter reads only these
    transport: str
    ledger_entry: dict | None
    note: str | None = None


class Source:
    """A transport source that changes between refits (as the ledger does when someone runs
    ``reshardctl rollback`` in another shell); counts how often it is asked."""

    def __init__(self, script):
        self.script, self.calls = script, 0

    def __call__(self) -> Decision:
        d = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return d


def _entry(line: int, action: str, transport: str, user: str = "ops") -> dict:
    return {"line": line, "action": action, "time": "2026-12-01T22:00:00Z", "user": user, "transport": transport}


LONG = "ops-" + "x" * 3000  # a decision longer than one control broadcast (runtime/transport_decision.py DECISION_BYTES): sent in two


NOTE = "the ledger cannot be read (permission denied): the last good decision stands"
# update rank 0's source, call by call (step 1, 2, 3, 4 (corrupted), 5)
RANK0 = [Decision("reshard", None), Decision("gather_broadcast", _entry(3, "rollback", "gather_broadcast", LONG)),
         Decision("reshard", _entry(4, "promote", "reshard"), NOTE),
         Decision("reshard", _entry(4, "promote", "reshard"), NOTE)]
# every other rank's: it would disagree, and must never be asked
OTHERS = [Decision("hybrid", _entry(9, "promote", "hybrid"))]


class Bound:
    """What the Refitter needs of a binding (reshardctl.bind.Binding): ``tensors()`` (the framework's
    parameters as views per box) and ``land_copies()`` (after each commit on an inference rank)."""

    def __init__(self, tensors: dict):
        self._tensors, self.landed = tensors, 0

    def tensors(self) -> dict:
        return self._tensors

    def land_copies(self) -> None:
        self.landed += 1


def _world_ok(default_pg) -> bool:
    """The caller's own default world is the one it made, alive, and still works (an all-reduce)."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return dist.group.WORLD is default_pg and default_pg in c10d._world.pg_map and int(t.item()) == 2


def _own_world(rank: int, ports: dict, cfg: str):
    """This process's side, its own default world (its own store and port, world 2: the other side is
    not in it), the plan, and its UpdateGroup; with what torch had registered before reshardctl."""
    side, side_rank = ("train", rank) if rank < 2 else ("infer", rank - 2)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[side]}", rank=side_rank, world_size=2)
    default_pg = dist.group.WORLD
    before = set(c10d._world.pg_map)
    plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
    ug = api.UpdateGroup(address=f"127.0.0.1:{ports['update']}", token=TOKEN, side=side, side_rank=side_rank)
    return side, side_rank, default_pg, before, plan, ug


def _side(rank: int, ports: dict, cfg: str, events: str) -> dict:
    side, side_rank, default_pg, before, plan, ug = _own_world(rank, ports, cfg)
    by_name = {t.name: t for t in plan.model.tensors}
    source = Source(RANK0 if rank == 0 else OTHERS)
    # the binding's tensors: held boxes of the plan, step 0 to begin with
    boxes = (plan.src_holdings if side == "train" else plan.dst_holdings)(side_rank)
    local = {plan.model.tensors[i].name: [synthetic_region(plan.model.tensors[i], b, 0) for b in bs]
             for i, bs in boxes.items()}
    bound = Bound(local)
    out: dict = {"steps": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refitter = api.Refitter(plan, binding=bound, update_group=ug, transport_source=source, timeout_s=60,
                                events_dir=events)
        for step in (1, 2, 3, 4, 5):
            if side == "train":
                with torch.no_grad():
                    for n, bs in refitter.holdings().items():
                        for b, t in zip(bs, local[n]):
                            t.copy_(synthetic_region(by_name[n], b, step))
            if step == 4 and rank == 3:
                refitter.executor.tap = corrupt_once(4)
            try:
                rep = refitter.refit(step)
                ok, transport, entry = True, rep.transport, rep.ledger_entry
            except ReshardError as exc:
                ok, transport, entry = type(exc).__name__, None, None
            held = None
            if side == "infer":
                for want in (step, step - 1):
                    if all(torch.equal(t.view(torch.uint8), synthetic_region(by_name[n], b, want).view(torch.uint8))
                           for n, bs in refitter.holdings().items() for b, t in zip(bs, local[n])):
                        held = want
                        break
            out["steps"].append([step, ok, transport, entry, held, _world_ok(default_pg)])
        ours = set(c10d._world.pg_map) - before
        refitter.close()
    out["ours_while_open"] = len(ours)
    out["left_after_close"] = len(set(c10d._world.pg_map) - before)
    out["world_after_close"] = _world_ok(default_pg)
    out["source_calls"] = source.calls
    out["landed"] = bound.landed
    with open(f"{events}/events/rank-{rank}.jsonl") as fh:
        out["decided"] = [(e["step"], e["transport"], e.get("ledger_entry")) for e in map(json.loads, fh)
                          if e["phase"] == "decide"]
    out["warnings"] = [str(w.message) for w in caught if "transport source" in str(w.message)]
    dist.destroy_process_group()
    return out


def _intruder(ports: dict, cfg: str) -> str:
    """A process with the wrong token tries to join as inference rank 1."""
    plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
    ug = api.UpdateGroup(address=f"127.0.0.1:{ports['update']}", token="not-the-token", side="infer", side_rank=1)
    try:
        api.Refitter(plan, update_group=ug, timeout_s=60)
        return "joined"
    except ReshardError as exc:
        return f"{type(exc).__name__}: {exc}"


def _rank(rank: int, ports: dict, cfg: str, events: str, q) -> None:
    try:
        torch.set_num_threads(1)
        q.put((rank, _side(rank, ports, cfg, events) if rank < 4 else _intruder(ports, cfg), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def _ports() -> dict:
    got: set[int] = set()
    while len(got) < 3:
        got.add(free_port())
    train, infer, update = sorted(got)
    return {"train": train, "infer": infer, "update": update}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict:
    cfg = tmp_path_factory.mktemp("worlds") / "config.json"
    cfg.write_text(json.dumps(SMALL))
    ports = _ports()
    events = str(tmp_path_factory.mktemp("events"))
    return run_ranks(_rank, 5, lambda r, _port, q: (r, ports, str(cfg), events, q), timeout_s=600)


def test_two_worlds_refit_bit_exact_and_follow_rank0_source(worlds):
    """Steps 1-3 commit on both inference ranks, bit-exact; the transport switches at the next refit
    when rank 0's source changes (reshard -> gather_broadcast -> reshard), on every rank alike, and the
    report carries the ledger entry it came from."""
    want = [("reshard", None), ("gather_broadcast", _entry(3, "rollback", "gather_broadcast", LONG)),
            ("reshard", _entry(4, "promote", "reshard"))]
    for r in range(4):
        steps = worlds[r]["steps"]
        assert [(s[2], s[3]) for s in steps[:3]] == want, (r, steps)
        assert [s[1] for s in steps[:3]] == [True, True, True]
    for r in (2, 3):
        assert [s[4] for s in worlds[r]["steps"][:3]] == [1, 2, 3]
    for r in range(4):  # every refit's events say which transport and which ledger entry, on every rank
        assert worlds[r]["decided"][:3] == [(i + 1, t, e) for i, (t, e) in enumerate(want)], worlds[r]["decided"]


def test_only_update_rank_0_source_is_consulted_and_a_note_is_warned_once(worlds):
    assert worlds[0]["source_calls"] == 5
    assert all(worlds[r]["source_calls"] == 0 for r in (1, 2, 3))
    assert worlds[0]["warnings"] == [f"reshardctl: transport source: {NOTE}"]
    assert all(worlds[r]["warnings"] == [] for r in (1, 2, 3))


def test_failed_refit_keeps_old_weights_then_recovers_and_caller_worlds_untouched(worlds):
    """Step 4 corrupted on inference rank 1: every rank fails, both inference ranks still hold step 3;
    step 5 (fresh groups in the update world) commits. After every refit, failed or not, each side's own
    default world is the same group, registered, and its all-reduce works."""
    for r in range(4):
        steps = worlds[r]["steps"]
        assert steps[3][1] == "VerificationError", (r, steps[3])
        assert steps[4][1] is True and steps[4][2] == "reshard", (r, steps[4])
        assert all(s[5] for s in steps), (r, steps)
    for r in (2, 3):
        assert [s[4] for s in worlds[r]["steps"][3:]] == [3, 5]
        assert worlds[r]["landed"] == 4  # land_copies after each of the four commits, not after the failure


def test_close_releases_only_reshardctl_groups(worlds):
    for r in range(4):
        assert worlds[r]["ours_while_open"] > 0
        assert worlds[r]["left_after_close"] == 0
        assert worlds[r]["world_after_close"] is True


def test_a_process_without_the_token_is_refused(worlds):
    msg = worlds[4]
    assert msg.startswith("LaunchError") and "refused at rendezvous" in msg and "run token" in msg, msg


def _killed(rank: int, ports: dict, cfg: str, q) -> None:
    """Step 1 commits; then inference rank 1 (update rank 3) dies between refits, as a crashed engine
    does. Every surviving rank's step 2 fails; the trainers' own world still all-reduces, inference
    rank 0's own world is still its registered default group (its peer is dead: not all-reduced);
    close() leaves nothing of reshardctl's."""
    import os

    try:
        torch.set_num_threads(1)
        side, side_rank, default_pg, before, plan, ug = _own_world(rank, ports, cfg)
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, update_group=ug, timeout_s=30)
        local = {n: [synthetic_region(by_name[n], b, 1) for b in bs] for n, bs in refitter.holdings().items()}
        arg = "local_src" if side == "train" else "local_dst"
        refitter.refit(1, **{arg: local})
        if rank == 3:
            q.put((rank, "killed", None))
            q.close()
            q.join_thread()
            os._exit(1)
        try:
            refitter.refit(2, **{arg: local})
            out = {"step2": "committed"}
        except TransferError:  # the root cause, or a knock-on Abandoned (a TransferError)
            out = {"step2": "TransferError"}
        out["default_registered"] = dist.group.WORLD is default_pg and default_pg in c10d._world.pg_map
        if side == "train":
            out["world_ok"] = _world_ok(default_pg)
        refitter.close()
        out["left_after_close"] = len(set(c10d._world.pg_map) - before)
        q.put((rank, out, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_a_killed_inference_process_fails_the_refit_and_leaves_the_callers_worlds(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMALL))
    ports = _ports()
    res = run_ranks(_killed, 4, lambda r, _port, q: (r, ports, str(cfg), q), timeout_s=300)
    assert res[3] == "killed"
    for r in (0, 1, 2):
        assert res[r]["step2"] == "TransferError", (r, res[r])
        assert res[r]["default_registered"] is True
        assert res[r]["left_after_close"] == 0
    assert res[0]["world_ok"] is True and res[1]["world_ok"] is True
