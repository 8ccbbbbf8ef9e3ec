"""`reshardctl plan` through reshardctl.cli.main(argv): defaults, --json, --out (all or nothing),
--export-transfers checked by an independent checker, --compare-infer ordering."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from reshardctl.cli import main
from reshardctl.layout.build import build_layout
from reshardctl.models import load_model
from reshardctl.plan_files.serialize import load_plan
from reshardctl.site import load_profile
from reshardctl.topology import Topology



@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


@pytest.fixture
def small_model(small_llama) -> str:
    return small_llama


def run_json(capsys, *args) -> dict:
    code = main(["plan", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------ basics ----------------------------
def test_no_args_works(capsys):
    assert main(["plan"]) == 0
    out, err = capsys.readouterr()
    for word in ("reshard", "gather_broadcast", "hybrid", "lower bound", "NCCL m2n.reshard", "tiny-llama"):
        assert word in out
    assert "Traceback" not in err


def test_json_keys(capsys):
    d = run_json(capsys)
    for k in ("fingerprint", "bytes_total", "lower_bound_s", "lower_bound_reason", "transports", "m2n_compat",
              "planning_s", "inputs"):
        assert k in d, k
    assert set(d["transports"]) == {"reshard", "gather_broadcast", "hybrid"}
    model = load_model("tiny-llama")
    assert d["bytes_total"] == model.num_bytes
    assert d["inputs"]["site"] == "local" and d["inputs"]["model"] == "tiny-llama"
    assert d["inputs"]["relay"] is False  # local is cpu_only: auto = off
    assert d["inputs"]["bucket_bytes"] == load_profile("local").refit.bucket_bytes
    for name, t in d["transports"].items():
        for k in ("predicted_s", "efficiency", "bytes_moved", "transfers", "rounds", "buckets", "max_staging_bytes",
                  "busiest", "fingerprint", "bytes_by_link"):
            assert k in t, (name, k)
        assert sum(t["bytes_by_link"].values()) == t["bytes_moved"]
        assert t["efficiency"] == pytest.approx(d["lower_bound_s"] / t["predicted_s"])
        assert 0 < t["efficiency"] <= 1 + 1e-9
        assert t["max_staging_bytes"] <= d["inputs"]["bucket_bytes"]
    assert d["fingerprint"] == d["transports"][d["primary_transport"]]["fingerprint"]
    assert d["transports"]["gather_broadcast"]["rounds"] == 0 and d["transports"]["reshard"]["buckets"] == 0
    c = d["m2n_compat"]
    assert c["compatible_tensors"] + c["incompatible_tensors"] == len(model.tensors)


def test_single_transport_and_bucket(capsys):
    d = run_json(capsys, "--transport", "gather_broadcast", "--bucket-mb", "16", "--relay", "on")
    assert list(d["transports"]) == ["gather_broadcast"]
    assert d["inputs"]["bucket_bytes"] == 16 << 20 and d["inputs"]["relay"] is True
    assert d["primary_transport"] == "gather_broadcast"


@pytest.mark.parametrize("value,needle", [
    ("inf", "--bucket-mb inf: must be a finite number of MiB > 0, got inf"),
    ("nan", "--bucket-mb nan: must be a finite number of MiB > 0, got nan"),
    ("0", "--bucket-mb 0: must be a finite number of MiB > 0, got 0"),
    ("-1", "--bucket-mb -1: must be a finite number of MiB > 0, got -1"),
    ("1e-9", "--bucket-mb 1e-09: 1e-09 MiB x 1048576 bytes/MiB = 0.00105 bytes, less than one byte"),
    ("1e13", "--bucket-mb 1e+13: 1e+13 MiB is more than the limit of 1048576 MiB (1 TiB)"),
    ("1e300", "--bucket-mb 1e+300: 1e+300 MiB is more than the limit of 1048576 MiB (1 TiB)"),
])
def test_bad_bucket_mb(capsys, value, needle):
    code = main(["plan", "--bucket-mb", value])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_relay_auto_rule():
    """Concrete outcomes, not the formula again: on for dgx-h100 and gb200-nvl72, off for local
    (cpu_only) and for a GPU site whose NVLink is less than twice its per-GPU NIC bandwidth."""
    from reshardctl.request.resolve import resolve_relay
    from reshardctl.site import parse_profile

    assert resolve_relay("auto", load_profile("dgx-h100"))[0] is True    # 450 GB/s >= 2 x 50 GB/s
    assert resolve_relay("auto", load_profile("gb200-nvl72"))[0] is True
    assert resolve_relay("auto", load_profile("local"))[0] is False      # cpu_only
    slow_nvlink = parse_profile({"nodes": 2, "gpus_per_node": 8,
                                 "links": {"nvlink_gbytes_per_s": 90, "nic_gbits_per_s": 400,
                                           "nics_per_node": 8}}, "slow")
    on, why = resolve_relay("auto", slow_nvlink)                        # 90 GB/s < 2 x 50 GB/s
    assert on is False and "90 GB/s" in why and "50 GB/s" in why
    assert resolve_relay("on", load_profile("local"))[0] is True
    assert resolve_relay("off", load_profile("dgx-h100"))[0] is False


# ------------------------------------------------------------------ --out -----------------------------
def test_out_writes_loadable_plans(capsys, tmp_path):
    out = tmp_path / "o" / "plans"
    d = run_json(capsys, "--train", "tp=2,pp=2", "--out", str(out))
    names = sorted(p.name for p in out.iterdir())
    session = ["session.json", "session.pkl", "slurm"]  # the job scripts and session beside the plan
    assert names == ["plan-gather_broadcast.npz", "plan-hybrid.npz", "plan-reshard.npz", "plan.json", *session]
    assert json.loads((out / "plan.json").read_text())["fingerprint"] == d["fingerprint"]
    m = load_model("tiny-llama")
    tr = build_layout(m, "train", "tp=2,pp=2", "megatron")
    inf = build_layout(m, "infer", None, "vllm")
    topo = Topology.from_site(load_profile("local"), tr.world_size, inf.world_size)
    for t, rep in d["transports"].items():
        plan = load_plan(out / f"plan-{t}.npz", m, tr, inf, topo)
        assert plan.fingerprint == rep["fingerprint"]
    # rerun into the existing directory: files replaced, no temp files left
    d2 = run_json(capsys, "--train", "tp=2,pp=2", "--transport", "reshard", "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["plan-reshard.npz", "plan.json", *session]
    assert json.loads((out / "plan.json").read_text())["transports"].keys() == {"reshard"}
    assert load_plan(out / "plan-reshard.npz", m, tr, inf, topo).fingerprint == d2["fingerprint"] == d["fingerprint"]
    assert not list(tmp_path.glob("o/.*"))


def test_bad_layout_writes_nothing(capsys, tmp_path):
    out, exp = tmp_path / "out", tmp_path / "t.jsonl"
    code = main(["plan", "--train", "tp=3", "--out", str(out), "--export-transfers", str(exp)])
    _o, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in err and "16/3" in err and "tp=3" in err
    assert not out.exists() and not exp.exists()
    assert list(tmp_path.iterdir()) == []
    # an existing --out directory is left untouched by a failing run
    out.mkdir()
    (out / "plan.json").write_text("old")
    code = main(["plan", "--infer", "tp=2,dp=3", "--out", str(out)])
    _o, err = capsys.readouterr()
    assert code == 2 and "1 + 2 = 3 nodes" in err
    assert [p.name for p in out.iterdir()] == ["plan.json"] and (out / "plan.json").read_text() == "old"


def test_unwritable_outputs_are_errors_not_tracebacks(capsys):
    for args, flag in ((["--export-transfers", "/proc/x.jsonl"], "--export-transfers /proc/x.jsonl"),
                       (["--out", "/proc/foo"], "--out /proc/foo")):
        code = main(["plan", "--transport", "reshard", *args])
        _, err = capsys.readouterr()
        assert code == 2, err
        assert f"error: {flag}: cannot write" in err and "Traceback" not in err


def test_outputs_are_written_together_or_not_at_all(capsys, tmp_path):
    out, exp = tmp_path / "out", tmp_path / "t.jsonl"
    # a good --out and an unwritable --export-transfers: nothing is written
    assert main(["plan", "--transport", "reshard", "--out", str(out), "--export-transfers", "/proc/x.jsonl"]) == 2
    assert "--export-transfers /proc/x.jsonl: cannot write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # an unwritable --out and a good --export-transfers: nothing is written either
    assert main(["plan", "--transport", "reshard", "--out", "/proc/foo", "--export-transfers", str(exp)]) == 2
    assert "--out /proc/foo: cannot write" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # an existing --out DIR keeps its old content when the export fails
    out.mkdir()
    (out / "plan.json").write_text("old")
    assert main(["plan", "--transport", "reshard", "--out", str(out), "--export-transfers", "/proc/x.jsonl"]) == 2
    capsys.readouterr()
    assert [p.name for p in out.iterdir()] == ["plan.json"] and (out / "plan.json").read_text() == "old"
    # both good: both written
    assert main(["plan", "--transport", "reshard", "--out", str(out), "--export-transfers", str(exp)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == ["plan-reshard.npz", "plan.json", "session.json", "session.pkl",
                                                     "slurm"] and exp.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.jsonl"]


def test_os_error_last_resort_is_one_paragraph(capsys, monkeypatch):
    import reshardctl.commands.plan as plan_mod

    def boom(inp, progress=None, keep_plans=True):
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(plan_mod, "plan_report", boom)
    assert main(["plan"]) == 1
    err = capsys.readouterr().err
    assert "failed: Permission denied (/some/file)" in err and "Traceback" not in err
    assert main(["--verbose", "plan"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_all_layout_problems_listed(capsys):
    code = main(["plan", "--train", "tp=3", "--compare-infer", "tp=5"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "--train" in err and "--compare-infer" in err and "layout problems" in err
    # with --json the same error is one JSON object on stdout, every problem listed, nothing on stderr
    code = main(["plan", "--train", "tp=3", "--compare-infer", "tp=5", "--json"])
    out, err = capsys.readouterr()
    e = json.loads(out)["error"]
    assert code == 2 and err == "" and e["type"] == "LayoutError" and e["exit_code"] == 2
    assert any(p.startswith("--train") for p in e["problems"]) and any("--compare-infer" in p for p in e["problems"])


# ------------------------------------------------------------------ --export-transfers ----------------
def _holding_mask(placement, rank, shape) -> np.ndarray:
    m = np.zeros(shape, dtype=bool)
    for box in placement.holding(rank):
        m[tuple(slice(a, b) for a, b in box)] = True
    return m


def _sl(region) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in region)


def check_export(lines: list[dict], model, train, infer) -> dict:
    """Independent checker of an export: from the layouts' placements only.

    Every destination element is received exactly once from a source that holds it (stage 1: a
    trainer rank per the trainer placement, or a bucket broadcast whose gathers cover the tensor
    exactly once from holders; stage 2: an inference relay that received it in stage 1), and
    replaying the lines on synthetic data (a global arange per tensor) gives every inference rank
    exactly its slice."""
    T, I = train.world_size, infer.world_size
    idx = {t.name: i for i, t in enumerate(model.tensors)}
    truth = {t.name: np.arange(t.numel, dtype=np.int64).reshape(t.shape) for t in model.tensors}
    count = {}  # (tensor, infer rank) -> int array of receives per element
    buf = {}  # (tensor, infer rank) -> received values (-1 = nothing yet)

    def dst_arrays(name, r):
        key = (name, r)
        if key not in count:
            shape = model.tensors[idx[name]].shape
            count[key] = np.zeros(shape, dtype=np.int64)
            buf[key] = np.full(shape, -1, dtype=np.int64)
        return count[key], buf[key]

    def receive(name, r, sl, values):
        c, b = dst_arrays(name, r)
        c[sl] += 1
        b[sl] = values

    p2p = [ln for ln in lines if ln["op"] == "p2p"]
    for stage in (1, 2):
        for ln in (x for x in p2p if x["stage"] == stage):
            name, sl = ln["tensor"], _sl(ln["region"])
            t = model.tensors[idx[name]]
            assert ln["bytes"] == int(np.prod([b - a for a, b in ln["region"]])) * t.itemsize
            assert T <= ln["dst"] < T + I and ln["dst_side_rank"] == ln["dst"] - T
            if stage == 1:
                assert 0 <= ln["src"] < T and ln["src_side_rank"] == ln["src"]
                assert _holding_mask(train.placement(idx[name]), ln["src"], t.shape)[sl].all(), ln
                values = truth[name][sl]
            else:
                assert T <= ln["src"] < T + I and ln["src_side_rank"] == ln["src"] - T
                c, b = dst_arrays(name, ln["src"] - T)
                assert (c[sl] == 1).all(), f"relay {ln['src']} forwards {name}{ln['region']} it did not receive"
                values = b[sl]
            receive(name, ln["dst"] - T, sl, values)
    gathers: dict[tuple[int, str], np.ndarray] = {}
    for ln in (x for x in lines if x["op"] == "gather"):
        name, sl = ln["tensor"], _sl(ln["region"])
        t = model.tensors[idx[name]]
        assert 0 <= ln["src"] < T and 0 <= ln["dst"] < T
        assert _holding_mask(train.placement(idx[name]), ln["src"], t.shape)[sl].all(), ln
        gathers.setdefault((ln["bucket"], name), np.zeros(t.shape, np.int64))[sl] += 1
    for ln in (x for x in lines if x["op"] == "broadcast"):
        name = ln["tensor"]
        g = gathers.pop((ln["bucket"], name))
        assert (g == 1).all(), f"bucket {ln['bucket']}: {name} not gathered exactly once"
        assert sorted(ln["dst"]) == list(range(T, T + I)) and ln["dst_side_rank"] == list(range(I))
        for r in range(I):  # every inference rank keeps what it holds from the broadcast tensor
            keep = _holding_mask(infer.placement(idx[name]), r, model.tensors[idx[name]].shape)
            c, b = dst_arrays(name, r)
            c[keep] += 1
            b[keep] = truth[name][keep]
    assert not gathers, f"gathered but never broadcast: {sorted(gathers)[:3]}"
    received = 0
    for i, t in enumerate(model.tensors):
        for r in range(I):
            need = _holding_mask(infer.placement(i), r, t.shape)
            c, b = dst_arrays(t.name, r)
            assert (c[need] == 1).all(), f"{t.name} on infer rank {r}: elements received {c[need].min()}..{c[need].max()} times"
            assert (c[~need] == 0).all(), f"{t.name} on infer rank {r}: received elements it does not hold"
            assert (b[need] == truth[t.name][need]).all(), f"{t.name} on infer rank {r}: wrong data"
            received += int(need.sum()) * t.itemsize
    return {"lines": len(lines), "bytes_received": received}


def _export(capsys, tmp_path, model, *args) -> tuple[list[dict], dict]:
    exp = tmp_path / "t.jsonl"
    d = run_json(capsys, "--model", model, "--export-transfers", str(exp), *args)
    lines = [json.loads(x) for x in exp.read_text().splitlines()]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    return lines, d


@pytest.mark.parametrize("train,infer,relay", [
    ("tp=2,pp=2", "tp=2,dp=2", "on"),
    ("tp=2,dp=2", "tp=4", "off"),
    ("tp=4", "tp=1,dp=4", "on"),
])
def test_export_reshard_exact(capsys, tmp_path, small_model, train, infer, relay):
    lines, d = _export(capsys, tmp_path, small_model, "--transport", "reshard", "--train", train, "--infer", infer,
                       "--relay", relay)
    m = load_model(small_model)
    tl, il = build_layout(m, "train", train, "megatron"), build_layout(m, "infer", infer, "vllm")
    rep = check_export(lines, m, tl, il)
    assert all(ln["op"] == "p2p" for ln in lines)
    assert rep["lines"] == d["transports"]["reshard"]["p2p_transfers"]
    assert sum(ln["bytes"] for ln in lines) == d["transports"]["reshard"]["bytes_moved"]
    if relay == "on" and il.world_size > 1 and "dp=4" in infer:
        assert any(ln["stage"] == 2 for ln in lines)


@pytest.mark.parametrize("transport", ["gather_broadcast", "hybrid"])
def test_export_buckets_exact(capsys, tmp_path, small_model, transport):
    lines, d = _export(capsys, tmp_path, small_model, "--transport", transport, "--train", "tp=2,pp=2",
                       "--infer", "tp=2,dp=2", "--bucket-mb", "0.01")
    m = load_model(small_model)
    check_export(lines, m, build_layout(m, "train", "tp=2,pp=2", "megatron"), build_layout(m, "infer", None, "vllm"))
    ops = {ln["op"] for ln in lines}
    assert {"gather", "broadcast"} <= ops
    assert ("p2p" in ops) == (transport == "hybrid")
    assert len({ln["bucket"] for ln in lines if ln["op"] == "broadcast"}) == d["transports"][transport]["buckets"]


def test_checker_catches_a_bad_export(capsys, tmp_path, small_model):
    lines, _ = _export(capsys, tmp_path, small_model, "--transport", "reshard")
    m = load_model(small_model)
    tl, il = build_layout(m, "train", None, "megatron"), build_layout(m, "infer", None, "vllm")
    with pytest.raises(AssertionError):
        check_export(lines[1:], m, tl, il)  # a missing piece
    with pytest.raises(AssertionError):
        check_export(lines + lines[:1], m, tl, il)  # a duplicate
    first = lines[0]
    i = m.index(first["tensor"])
    wrong = [r for r in range(tl.world_size)
             if not _holding_mask(tl.placement(i), r, m.tensors[i].shape)[_sl(first["region"])].all()]
    assert wrong  # tp=2: the other TP rank does not hold this piece
    bad = dict(first, src=wrong[0], src_side_rank=wrong[0])
    with pytest.raises(AssertionError):
        check_export([bad] + lines[1:], m, tl, il)  # a source that does not hold the piece
    c = first["region"]
    wrong_data = [dict(first, region=[[a, b] for a, b in c])]
    wrong_data[0]["dst"] = first["dst"] + 1 if first["dst"] + 1 < tl.world_size + il.world_size else first["dst"] - 1
    wrong_data[0]["dst_side_rank"] = wrong_data[0]["dst"] - tl.world_size
    with pytest.raises(AssertionError):
        check_export(wrong_data + lines[1:], m, tl, il)  # delivered to the wrong rank


# ------------------------------------------------------------------ --compare-infer -------------------
def test_compare_infer_ordered_by_predicted(capsys):
    d = run_json(capsys, "--transport", "reshard", "--compare-infer", "tp=4", "--compare-infer", "tp=1,dp=4",
                 "--compare-infer", "tp=2,dp=1")
    rows = d["compare"]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert [r["predicted_s"] for r in rows] == sorted(r["predicted_s"] for r in rows)
    assert {r["infer"] for r in rows} == {"tp=4", "tp=1,dp=4", "tp=2,dp=1", "tp=2,dp=2"}
    assert sum(r["current"] for r in rows) == 1
    assert all(r["transport"] == "reshard" for r in rows)
    assert main(["plan", "--compare-infer", "tp=4"]) == 0
    out, _ = capsys.readouterr()
    assert "by predicted refit time" in out


def test_help_lists_plan(capsys):
    assert main(["--help"]) == 0
    assert "plan" in capsys.readouterr().out


LAYOUT_3D = """\
world_size: 8
side: train
rules:
  - match: "*.mlp.*"
    mesh: {shape: [2, 2, 2], dim_names: [a, b, c]}
    placements: ["Shard(0)", "Replicate()", "Replicate()"]
default:
  mesh: {shape: [8], dim_names: [dp]}
  placements: ["Replicate()"]
"""


def test_layout_file_and_compat_reasons(capsys, tmp_path, small_model):
    lf = tmp_path / "train.yaml"
    lf.write_text(LAYOUT_3D)
    d = run_json(capsys, "--model", small_model, "--train-layout", str(lf), "--infer", "tp=2,dp=2",
                 "--site", "dgx-h100", "--transport", "reshard")
    c = d["m2n_compat"]
    assert "mesh" in c["mesh_source"]
    g = c["reasons"]["train_mesh_ndim"]
    assert g["tensors"] == 6 and g["max"] == 3  # gate/up/down of 2 layers
    assert all(".mlp." in n for n in g["examples"])
    assert c["incompatible_tensors"] == 6 and c["compatible_tensors"] == c["tensors"] - 6
    assert d["inputs"]["train"].startswith("dtensor")
    assert main(["plan", "--model", small_model, "--train-layout", str(lf), "--site", "dgx-h100"]) == 0
    out, _ = capsys.readouterr()
    assert "6 trainer mesh has more than 2 dims" in out


# ------------------------------------------------------------------ documented examples ---------------
QUICKSTART_DEEPSEEK = ["--site", "dgx-h100", "--model", "deepseek-v3", "--train", "pp=16,ep=16,first=3,last=2",
                       "--infer", "tp=32,dp=8"]


def test_quickstart_deepseek_v3_example_fits_the_shipped_dgx_h100_profile(capsys):
    """docs/quickstart.md's example (256 + 256 ranks = 32 + 32 nodes) must plan on the shipped dgx-h100
    profile (128 nodes). Planned for the primary transport only (~4 s; all three take ~7 s): the inputs,
    layouts and allocation checked are the same."""
    d = run_json(capsys, *QUICKSTART_DEEPSEEK, "--transport", "reshard")
    topo = d["inputs"]["topology"]
    assert (topo["train_world"], topo["infer_world"], topo["train_nodes"], topo["infer_nodes"]) == (256, 256, 32, 32)
    assert d["inputs"]["model"] == "deepseek-v3" and d["transports"]["reshard"]["bytes_moved"] > 0


# ------------------------------------------------------------------ table rendering -------------------
def test_efficiency_below_one_percent_is_not_zero():
    from reshardctl.commands.plan import _pct

    assert [_pct(e) for e in (1.0, 0.63, 0.04, 0.004, 0.00042, 0.0)] == ["100%", "63%", "4%", "0.4%", "0.04%", "0%"]


def test_lower_bound_reason_humanized_in_the_table_raw_in_json(capsys):
    from reshardctl.commands.plan import _human_reason

    assert (_human_reason("NVLink domain 63 must take in 50974531584 distinct bytes over the NICs of 1 node(s)")
            == "NVLink domain 63 must take in 47.5 GiB of distinct bytes over the NICs of 1 node(s)")
    assert _human_reason("inference rank 3 must receive 1048576 bytes over NVLink+NIC") == \
        "inference rank 3 must receive 1.0 MiB over NVLink+NIC"
    assert _human_reason("1610612736 model bytes must leave 2 trainer node(s)").startswith("1.5 GiB of model bytes")
    d = run_json(capsys, "--site", "dgx-h100")
    assert main(["plan", "--site", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    raw = re.search(r"\d{5,}", d["lower_bound_reason"])
    assert raw, d["lower_bound_reason"]  # --json keeps the raw byte count
    (line,) = [ln for ln in out.splitlines() if ln.startswith("lower bound")]
    assert raw[0] not in line and "B" in line
    assert "busiest step: rank, link, bytes" in out


def test_plan_marks_the_sites_active_transport_after_a_rollback(capsys, tmp_path):
    """Without --transport the primary transport (the '*' row, the fingerprint, --export-transfers) is
    the site's active one: its ledger's after a `rollback`, else the profile's refit.transport."""
    import yaml

    from helpers.runbook_helpers import site_profile

    site = site_profile(tmp_path, "active", budget_s=60, state_dir=tmp_path / "state")
    data = yaml.safe_load(open(site))
    data["refit"]["transport"] = "reshard"
    open(site, "w").write(yaml.safe_dump(data))
    args = ["plan", "--site", site, "--model", "tiny-llama", "--train", "tp=2", "--infer", "tp=2", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["primary_transport"] == "reshard"
    assert main(["rollback", "--site", site, "--reason", "test"]) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["primary_transport"] == "gather_broadcast"
    assert main(args + ["--transport", "hybrid"]) == 0  # a flag still wins
    assert json.loads(capsys.readouterr().out)["primary_transport"] == "hybrid"
