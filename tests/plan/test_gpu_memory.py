"""``plan/gpu_memory.py``: the per-GPU memory ``plan`` reports, checked rank by rank against the runtime's
own accounting (``preconnect.program_peers`` from every rank's program, the memory check's holdings and
``nccl_bytes``) on random plans, and end to end through ``reshardctl plan`` on real catalog models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.planner_scenarios import SCALE, SETTINGS, scenario_plan, scenarios
from reshardctl.launch.memory_check import _holding_bytes, nccl_bytes
from reshardctl.plan.gpu_memory import RESERVE, communicators, gpu_memory, held_bytes, p2p_directions, pool_limit_bytes
from reshardctl.runtime.groups import broadcast_groups
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.preconnect import program_peers
from reshardctl.site.parse import parse_profile
from reshardctl.site.spec import NcclSpec
from reshardctl.errors import ProfileError

SMALL = NcclSpec(buffsize_mb=1, max_channels=2, p2p_channels_per_peer=1)


@settings(max_examples=30 * SCALE, **SETTINGS)
@given(s=scenarios(), transport=st.sampled_from(["reshard", "gather_broadcast", "hybrid"]), relay=st.booleans())
def test_every_ranks_figures_are_the_runtimes_own(s, transport, relay):
    plan = scenario_plan(s, transport, relay)
    T, world = plan.train_world, plan.world
    sends, recvs = p2p_directions(plan)
    comms = communicators(plan)
    train_held, infer_held = held_bytes(plan.model, plan.train), held_bytes(plan.model, plan.infer)
    for r in range(world):
        ps, pr = program_peers(plan, r)
        assert (sends[r], recvs[r]) == (len(ps), len(pr)), r
        assert comms[r] == 1 + sum(1 for g in broadcast_groups(plan) if r in g and len(g) < world)
        want = nccl_bytes([plan], r, SMALL)
        assert (want["p2p_directions"], want["communicators"]) == (sends[r] + recvs[r], comms[r])
    for r in range(T):
        assert train_held[r] == _holding_bytes(plan.model, plan.src_holdings(r))
    for r in range(plan.infer_world):
        holdings = plan.dst_holdings(r)
        assert infer_held[r] == _holding_bytes(plan.model, holdings)
        # the staged copy as the runtime allocates it (one arena; boxes aligned to their element size)
        staged = LocalWeights.in_arena(plan.model, holdings, "cpu", touch=False)
        arena = staged.data and next(iter(staged.data.values()))[0].untyped_storage().nbytes()
        boxes = sum(len(b) for b in holdings.values())
        assert staged.nbytes == infer_held[r] and (not boxes or infer_held[r] <= arena <= max(8, infer_held[r] + 8 * boxes))
    # the busiest ranks and their arithmetic
    m = gpu_memory(plan, SMALL, gpu_bytes=1 << 40)
    pool = pool_limit_bytes(plan.bucket_bytes)
    totals = [2 * int(infer_held[i]) + pool + nccl_bytes([plan], T + i, SMALL)["total"] for i in range(plan.infer_world)]
    inf = m["inference"]
    assert inf["total_bytes"] == max(totals) == totals[inf["side_rank"]] and inf["rank"] == T + inf["side_rank"]
    assert inf["total_bytes"] == inf["weights_bytes"] + inf["staged_copy_bytes"] + inf["pool_bytes"] + inf["nccl"]["bytes"]
    tr = m["trainer"]
    assert tr["refit_bytes"] == pool + max(nccl_bytes([plan], r, SMALL)["total"] for r in range(T))
    assert m["fits"] is (inf["total_bytes"] <= int((1 << 40) * (1 - RESERVE)))
    assert inf["refit_bytes"] == inf["total_bytes"] - inf["weights_bytes"]
    # the engine's largest share: every inference rank's refit bytes beside it, and not 0.01 more
    own = max(t - int(w) for t, w in zip(totals, infer_held))
    u = m["max_engine_memory_utilization"]
    assert u * (1 << 40) + own <= (1 << 40) < (u + 0.01) * (1 << 40) + own
    unchecked = gpu_memory(plan, SMALL)
    assert unchecked["fits"] is None and unchecked["max_engine_memory_utilization"] is None


def test_a_gpu_too_small_for_the_staged_copy_does_not_fit_by_the_arithmetic():
    plan = scenario_plan(_one_scenario(), "reshard", False)
    need = gpu_memory(plan, SMALL)["inference"]["total_bytes"]
    usable = lambda gpu: int(gpu * (1 - RESERVE))  # noqa: E731
    at = int(need / (1 - RESERVE)) + 2  # the smallest GPU that holds it (after the reserve)
    assert usable(at) >= need and gpu_memory(plan, SMALL, at)["fits"] is True
    short = gpu_memory(plan, SMALL, at - 4)
    assert usable(at - 4) < need and short["fits"] is False and short["inference_left_bytes"] == usable(at - 4) - need


def _one_scenario():
    from hypothesis import find

    return find(scenarios(), lambda s: s[2].world_size >= 2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reshardctl", *args], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="200"))  # no line of the output wrapped


def _plan_json(tmp_path, profile: dict | str, *args: str) -> dict:
    site = profile
    if isinstance(profile, dict):
        path = tmp_path / "site.yaml"
        path.write_text(yaml.safe_dump(profile))
        site = str(path)
    res = _cli("plan", "--site", site, *args, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


H100 = {"site": "h100", "nodes": 16, "gpus_per_node": 8, "gpu_memory_gib": 79.6,
        "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400, "nics_per_node": 8}}
LLAMA = ("--model", "llama-3.1-70b", "--train", "tp=8,pp=8", "--infer", "tp=8,dp=8")


def test_plan_reports_each_transports_gpu_memory_against_the_profile(tmp_path):
    got = _plan_json(tmp_path, H100, *LLAMA)
    gpu = int(79.6 * (1 << 30))
    needed = got["bytes_needed_by_inference_ranks"] // 64  # every inference rank holds 1/8 of the model: the same
    for t, row in got["transports"].items():
        m = row["gpu_memory"]
        inf = m["inference"]
        assert m["gpu_bytes"] == gpu and inf["weights_bytes"] == inf["staged_copy_bytes"]
        assert abs(inf["weights_bytes"] - needed) <= needed // 100, t  # tp=8: 1/8 of the model (norms replicated)
        assert inf["pool_bytes"] == pool_limit_bytes(row["bucket_bytes"])
        assert m["fits"] is True and m["inference_left_bytes"] == int(gpu * (1 - RESERVE)) - inf["total_bytes"]
    # gather-and-broadcast: every inference rank in a sub-communicator per pipeline stage's root, besides the data group
    assert got["transports"]["gather_broadcast"]["gpu_memory"]["inference"]["nccl"]["communicators"] == 1 + 8
    assert got["transports"]["reshard"]["gpu_memory"]["inference"]["nccl"]["communicators"] == 1


def test_a_gpu_too_small_is_said_in_the_text_and_no_gpu_memory_key_is_not_checked(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**H100, "gpu_memory_gib": 24}))
    res = _cli("plan", "--site", str(small), *LLAMA, "--transport", "reshard")
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("reshard: infer"))
    assert "does NOT fit" in line and "over" in line
    assert "24.0 GiB per GPU less 10%" in res.stdout and "staged copy" in res.stdout
    unset = {k: v for k, v in H100.items() if k != "gpu_memory_gib"}
    row = _plan_json(tmp_path, unset, *LLAMA, "--transport", "reshard")["transports"]["reshard"]["gpu_memory"]
    assert row["gpu_bytes"] is None and row["fits"] is None and row["inference"]["total_bytes"] > 0
    assert _plan_json(tmp_path, "local", "--transport", "reshard")["transports"]["reshard"]["gpu_memory"] is None


@pytest.mark.parametrize("bad", [0, -1, "80G", True, 1e9])
def test_a_bad_gpu_memory_is_refused_naming_the_key(bad):
    with pytest.raises(ProfileError) as info:
        parse_profile({**H100, "gpu_memory_gib": bad}, "site.yaml")
    assert "site.yaml" in str(info.value) and "gpu_memory_gib" in str(info.value)


def test_deepseek_v3_bf16_at_tp32_does_not_fit_an_h100_with_its_staged_copy(tmp_path):
    """docs/plan-format.md's example: 40.9 GiB per inference GPU, twice that over 80 GB; tp=64 halves it
    (the --compare-infer rows say which candidate fits)."""
    got = _plan_json(tmp_path, "dgx-h100", "--model", "deepseek-v3", "--train", "pp=16,ep=16,first=3,last=2",
                     "--transport", "reshard", "--infer", "tp=32,dp=8", "--compare-infer", "tp=64,dp=4",
                     "--compare-infer", "tp=32,dp=8")
    tp32 = got["transports"]["reshard"]["gpu_memory"]
    assert round(tp32["inference"]["weights_bytes"] / (1 << 30), 1) == 40.9 and tp32["fits"] is False
    # beside the refit's 44.5 GiB (staged copy + pool + NCCL) the engine may take at most 0.44 of 79.6 GiB
    assert tp32["max_engine_memory_utilization"] == 0.44
    assert 2 * tp32["inference"]["weights_bytes"] > tp32["gpu_bytes"] * (1 - RESERVE)
    rows = {r["infer"]: r for r in got["compare"]}
    assert (rows["tp=32,dp=8"]["gpu_memory_bytes"], rows["tp=32,dp=8"]["fits"]) == (tp32["inference"]["total_bytes"], False)
    tp64 = rows["tp=64,dp=4"]
    assert tp64["fits"] is True and tp64["gpu_memory_bytes"] <= tp32["gpu_bytes"] * (1 - RESERVE)
    # half the weights (twice: served and staged) less: the pool and NCCL's buffers stay about the same
    assert abs((tp32["inference"]["total_bytes"] - tp64["gpu_memory_bytes"]) - tp32["inference"]["weights_bytes"]) \
        < tp32["inference"]["weights_bytes"] // 10


def test_a_slurm_session_that_cannot_fit_a_gpu_is_refused_before_submitting(tmp_path):
    """``check_profile_gpu_memory``: the session's plans (their NCCL groups together) against the profile."""
    from reshardctl.launch.memory_check import check_profile_gpu_memory
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**H100, "gpu_memory_gib": 24}))
    inp = prepare(RefitRequest(site=str(path), model="llama-3.1-70b", train="tp=8,pp=8", infer="tp=8,dp=8"))
    from reshardctl.plan.planner import build_plan

    plans = {t: build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=t, bucket_bytes=inp.bucket_bytes,
                           relay=inp.relay, broadcast_span=inp.broadcast_span)
             for t in ("reshard", "gather_broadcast")}
    with pytest.raises(ProfileError) as info:
        check_profile_gpu_memory(plans, inp.site)
    text = str(info.value)
    session = gpu_memory(plans, inp.site.nccl, inp.site.gpu_memory_bytes)["inference"]
    assert str(path) in text and "gpu_memory_gib 24" in text and "nothing was submitted" in text
    assert f"{session['total_bytes']} > {int(24 * (1 << 30) * (1 - RESERVE))} bytes" in text
    # the session's communicators: the broadcast plan's groups as well as the data group
    assert session["nccl"]["communicators"] == 1 + 8
    roomy = parse_profile({**H100, "gpu_memory_gib": 79.6}, "roomy.yaml")
    check_profile_gpu_memory(plans, roomy)  # fits: nothing raised
    check_profile_gpu_memory(plans, parse_profile({k: v for k, v in H100.items() if k != "gpu_memory_gib"}, "u.yaml"))


def test_profile_show_gives_the_gpu_memory_or_says_it_is_not_checked(tmp_path):
    shown = _cli("profile", "show", "dgx-h100").stdout
    assert "8 GPUs per node, 1024 in all, 79.6 GiB each" in shown
    path = tmp_path / "nomem.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in H100.items() if k != "gpu_memory_gib"}))
    assert "(no gpu_memory_gib: plan checks no GPU's memory)" in _cli("profile", "show", str(path)).stdout
    assert json.loads(_cli("profile", "show", "dgx-h100", "--json").stdout)["gpu_memory_gib"] == 79.6


def test_plan_out_for_gpus_too_small_writes_nothing_and_says_why(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**H100, "gpu_memory_gib": 24}))
    out = tmp_path / "plans"
    res = _cli("plan", "--site", str(small), *LLAMA, "--transport", "reshard", "--out", str(out))
    assert res.returncode == 2 and not out.exists(), res.stdout + res.stderr
    assert str(small) in res.stderr and "gpu_memory_gib 24" in res.stderr and "staged copy" in res.stderr
    assert "Traceback" not in res.stderr
    roomy = tmp_path / "roomy.yaml"
    roomy.write_text(yaml.safe_dump(H100))
    res = _cli("plan", "--site", str(roomy), *LLAMA, "--transport", "reshard", "--out", str(out))
    assert res.returncode == 0 and (out / "plan-reshard.npz").is_file(), res.stdout + res.stderr


def test_a_slurm_run_that_cannot_fit_its_gpus_submits_nothing(tmp_path):
    """``run --launcher slurm``: refused by the profile's GPU memory before any job is submitted (an sbatch
    on PATH that would record a submission is never called) and before a run directory is made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "submitted"
    for tool in ("sbatch", "squeue", "sinfo", "scontrol"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    site = tmp_path / "slurm.yaml"
    site.write_text(yaml.safe_dump({**H100, "gpu_memory_gib": 24, "launcher": "slurm", "slurm": {"partition": "gpu"}}))
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "reshardctl", "run", "--site", str(site), *LLAMA, "--transport",
                          "reshard", "--out", str(out)], capture_output=True, text=True,
                         env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", COLUMNS="200"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "gpu_memory_gib 24" in res.stderr and "nothing was submitted" in res.stderr and "Traceback" not in res.stderr
    assert not marker.exists() and not out.exists()
