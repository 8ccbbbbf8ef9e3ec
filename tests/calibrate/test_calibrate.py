"""`reshardctl calibrate` and calibration files: real microbenchmark processes, the file's checks (file
and key named, exit 2, nothing written on failure), where plan/profile find it, and what they say."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reshardctl.cli import main
from reshardctl.errors import ProfileError
from reshardctl.site import load_profile
from reshardctl.site.measured import FIGURES, FORMAT, default_path, find_measured, parse_measured, read_measured

PLAN = ("plan", "--site", "local", "--model", "tiny-llama", "--train", "tp=2", "--infer", "tp=2", "--json")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def good(site="local", **over) -> dict:
    figs = {k: (2e9 if k.endswith("bytes_per_s") else 5e-5) for k in FIGURES}
    return {"format": FORMAT, "site": site, "date": "2026-01-02T03:04:05Z", "hosts": ["h1"],
            "versions": {"torch": "2.13.0"}, "ranks": 8, "cores": 2, "figures": figs, **over}


def test_parse_names_file_and_key():
    bad = good()
    bad["figures"] = {**bad["figures"], "copy_bytes_per_s": -1}
    del bad["figures"]["launch_s"]
    with pytest.raises(ProfileError) as e:
        parse_measured(bad, "cal.json", "local")
    msg = str(e.value)
    assert "cal.json" in msg and "figures.copy_bytes_per_s" in msg and "figures.launch_s" in msg
    with pytest.raises(ProfileError, match="measured for site 'other'"):
        parse_measured(good("other"), "cal.json", "local")
    with pytest.raises(ProfileError, match="date"):
        parse_measured(good(date="yesterday"), "cal.json")


def test_optional_figures_may_be_absent_and_are_checked_when_present():
    """A file written before ``checksum_world_bytes_per_s`` was measured still reads (the cost model
    falls back to one side's rate); a bad value of it is named like any other figure."""
    from reshardctl.plan.cost import Links
    from reshardctl.site import load_profile

    old = parse_measured(good(), "cal.json", "local")
    assert "checksum_world_bytes_per_s" not in old.figures
    assert Links.from_site(load_profile("local"), old).checksum_world is None
    new = good()
    new["figures"] = {**new["figures"], "checksum_world_bytes_per_s": 1.5e9}
    assert Links.from_site(load_profile("local"), parse_measured(new, "cal.json", "local")).checksum_world == 1.5e9
    new["figures"]["checksum_world_bytes_per_s"] = 0
    with pytest.raises(ProfileError, match="figures.checksum_world_bytes_per_s"):
        parse_measured(new, "cal.json", "local")
    assert Links.from_site(load_profile("local"), old).control is None
    new["figures"] = {**good()["figures"], "control_round_s": 0.004}
    assert Links.from_site(load_profile("local"), parse_measured(new, "cal.json", "local")).control == 0.004
    new["figures"]["control_round_s"] = -1
    with pytest.raises(ProfileError, match="figures.control_round_s"):
        parse_measured(new, "cal.json", "local")


def test_landing_figures_replace_the_profile_defaults_and_are_checked():
    """The landing term's constants: the profile's (defaults measured here) until a calibration measured
    them; a file without them (written before) keeps the profile's; a bad value is named."""
    from reshardctl.plan.cost import Links
    from reshardctl.site import load_profile

    site = load_profile("local")
    old = Links.from_site(site, parse_measured(good(), "cal.json", "local"))
    assert old.land_param == site.links.landing_us_per_param * 1e-6 > 0
    assert old.loader_call == site.links.loader_us_per_tensor * 1e-6 > 0
    new = good()
    new["figures"] = {**new["figures"], "landing_s_per_param": 3e-7, "loader_s_per_tensor": 9e-6}
    links = Links.from_site(site, parse_measured(new, "cal.json", "local"))
    assert (links.land_param, links.loader_call) == (3e-7, 9e-6)
    from reshardctl.plan.cost import MAPPING_ENTRY_S, NAMED_PARAM_S

    assert (links.mapping_entry, links.named_param) == (MAPPING_ENTRY_S, NAMED_PARAM_S)  # not measured: defaults
    new["figures"].update(mapping_s_per_entry=7e-8, named_params_s_per_param=2e-6)
    links = Links.from_site(site, parse_measured(new, "cal.json", "local"))
    assert (links.mapping_entry, links.named_param) == (7e-8, 2e-6)
    new["figures"]["mapping_s_per_entry"] = -1.0
    with pytest.raises(ProfileError, match="figures.mapping_s_per_entry"):
        parse_measured(new, "cal.json", "local")
    new["figures"]["mapping_s_per_entry"] = 7e-8
    new["figures"]["loader_s_per_tensor"] = float("inf")
    new["figures"]["landing_s_per_param"] = 0
    with pytest.raises(ProfileError) as e:
        parse_measured(new, "cal.json", "local")
    assert "figures.loader_s_per_tensor" in str(e.value) and "figures.landing_s_per_param" in str(e.value)


def test_found_in_the_state_directory_and_used_by_plan(capsys):
    code, out, err = run(capsys, *PLAN)
    assert code == 0, err
    before = json.loads(out)
    assert before["cost_figures"].startswith("datasheet")  # on cpu_only sites with this machine's checksum probe
    path = default_path("local")
    assert str(path).startswith(os.environ["XDG_STATE_HOME"])
    path.parent.mkdir(parents=True)
    slow = good()
    slow["figures"] = {k: (v / 100 if k.endswith("bytes_per_s") else v) for k, v in slow["figures"].items()}
    path.write_text(json.dumps(slow))
    code, out, err = run(capsys, *PLAN)
    assert code == 0, err
    after = json.loads(out)
    assert after["cost_figures"].startswith(f"calibration {path}")
    for t in ("reshard", "gather_broadcast"):  # 100x slower measured links: slower predictions
        assert after["transports"][t]["predicted_s"] > before["transports"][t]["predicted_s"]
        assert set(after["transports"][t]["predicted_breakdown_s"]) == {"wire", "latency", "pack", "checksum", "sync",
                                                                         "landing"}


def test_bad_file_is_exit_2_without_traceback(capsys):
    path = default_path("local")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    code, out, err = run(capsys, *PLAN)
    # PLAN asks for --json: the error is one JSON object on stdout (docs/plan-format.md)
    e = json.loads(out)["error"]
    assert code == 2 and e["exit_code"] == 2 and str(path) in e["message"] and "not valid JSON" in e["message"]
    assert "Traceback" not in out + err


def test_profile_measured_key(tmp_path, capsys):
    (tmp_path / "cal.json").write_text(json.dumps(good("mine")))
    prof = tmp_path / "mine.yaml"
    prof.write_text("site: mine\nnodes: 2\ngpus_per_node: 2\ncpu_only: true\nmeasured: cal.json\n"
                    "links: {nvlink_gbytes_per_s: 5, nic_gbits_per_s: 40}\n")
    m = find_measured(load_profile(str(prof)))
    assert m is not None and Path(m.path) == tmp_path / "cal.json"  # relative to the profile's directory
    code, out, err = run(capsys, "profile", "show", str(prof))
    assert code == 0, err
    assert "measured" in out and "cal.json" in out and "2026-01-02" in out and "old" in out
    code, out, _ = run(capsys, "profile", "show", str(prof), "--json")
    cal = json.loads(out)["calibration"]
    assert cal["hosts"] == ["h1"] and cal["age_s"] > 0
    (tmp_path / "cal.json").unlink()
    code, out, err = run(capsys, "profile", "show", str(prof))
    assert code == 2 and "measured: cal.json: no such file" in err and "Traceback" not in out + err


def test_profile_show_says_when_there_is_no_calibration(capsys):
    code, out, _err = run(capsys, "profile", "show", "local")
    assert code == 0 and "measured: none" in out and "datasheet" in out


def test_gpu_site_cannot_be_calibrated_from_here(capsys, tmp_path):
    out_file = tmp_path / "c.json"
    code, _out, err = run(capsys, "calibrate", "--site", "dgx-h100", "--out", str(out_file))
    assert code == 2 and "dgx-h100" in err and "launcher" in err and not out_file.exists()


def test_out_in_missing_directory_is_exit_2(capsys, tmp_path):
    code, _out, err = run(capsys, "calibrate", "--site", "local", "--out", str(tmp_path / "no" / "c.json"))
    assert code == 2 and "does not exist" in err


def test_calibrate_local_for_real(capsys, tmp_path):
    """8 real processes (gloo): the file is valid, names this host and these versions, and plan uses it."""
    out_file = tmp_path / "cal.json"
    code, out, err = run(capsys, "calibrate", "--site", "local", "--out", str(out_file), "--reps", "1", "--json")
    assert code == 0, err
    m = read_measured(out_file, "local")
    assert m.ranks == 8 and m.hosts and m.versions["backend"] == "gloo" and m.versions["torch"]
    assert all(v > 0 for v in m.figures.values())
    raw = json.loads(out_file.read_text())["samples"]
    assert len(raw["p2p"]["intra_node"]) >= 3 and raw["broadcast"]["receivers"] == 4
    assert raw["checksum_world"]["ranks"] == 8 and m.figures["checksum_world_bytes_per_s"] > 0
    assert raw["control"]["ranks"] == 8 and m.figures["control_round_s"] == raw["control"]["seconds"] > 0
    # the landing microbenchmark's host costs, per segment and per loader call, as measured
    ld = raw["landing"]
    assert ld["views"] > 0 and m.figures["landing_s_per_param"] == ld["direct_seconds"] / ld["views"] > 0
    assert m.figures["loader_s_per_tensor"] == ld["loader_seconds"] / ld["views"] > 0
    # and a framework load_weights' host costs (plan/engine_cost.py), per mapping entry and per parameter
    assert m.figures["mapping_s_per_entry"] == ld["mapping_seconds"] / ld["views"] > 0
    assert m.figures["named_params_s_per_param"] == ld["named_params_seconds"] / ld["views"] > 0
    # the same file through the default location: plan and run find it by site name
    default_path("local").parent.mkdir(parents=True)
    default_path("local").write_text(out_file.read_text())
    code, out, err = run(capsys, *PLAN)
    assert code == 0 and json.loads(out)["cost_figures"].startswith("calibration")


def test_cost_figure_keys_of_the_profile_are_checked():
    from reshardctl.site.parse import parse_profile

    base = {"nodes": 2, "gpus_per_node": 4, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400}}
    p = parse_profile(base, "p.yaml")
    assert p.links.nvlink_efficiency == 0.84 and p.links.launch_us is None and p.measured is None
    bad = {**base, "links": {**base["links"], "nic_efficiency": 1.5, "launch_us": -1, "mem_gbytes_per_s": 0}}
    with pytest.raises(ProfileError) as e:
        parse_profile(bad, "p.yaml")
    msg = str(e.value)
    assert "p.yaml" in msg and "links.nic_efficiency" in msg and "links.launch_us" in msg
    assert "links.mem_gbytes_per_s" in msg
