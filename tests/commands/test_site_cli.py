"""`reshardctl profile show|validate|list` through reshardctl.cli.main(argv) and through the installed script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reshardctl.cli import main
from reshardctl.site import load_profile, profile_to_dict

GOOD = """\
site: good
nodes: n[1-2]
gpus_per_node: 4
links: {nvlink_gbytes_per_s: 450, nic_gbits_per_s: 400}
"""
TYPO = GOOD.replace("nvlink_gbytes_per_s", "nvlink_gbytes_per_sec")
SCRIPT = Path(sys.executable).parent / "reshardctl"


@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    typo = tmp_path / "typo.yaml"
    typo.write_text(TYPO)
    bad_hosts = tmp_path / "hosts.yaml"
    bad_hosts.write_text(GOOD.replace("n[1-2]", "n[x]"))
    return good, typo, bad_hosts


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_default_is_local(capsys):
    code, out, err = run(capsys, "profile", "show")
    assert code == 0, err
    assert "local" in out and "builtin:local" in out and "local-train" in out


@pytest.mark.parametrize("name", ["local", "slurm-local", "dgx-h100", "gb200-nvl72"])
def test_show_json_is_resolved_profile(capsys, name):
    code, out, _ = run(capsys, "profile", "show", name, "--json")
    assert code == 0
    data = json.loads(out)
    derived = data.pop("derived")
    assert data.pop("calibration") is None  # no calibration file in this test's state directory
    assert data.pop("chosen_by") == {"source": "flag", "text": "site from the command line"}
    assert data == profile_to_dict(load_profile(name))
    p = load_profile(name)
    assert derived["total_gpus"] == p.total_gpus and derived["gpus_per_domain"] == p.gpus_per_domain


def test_show_file(capsys, files):
    code, out, _ = run(capsys, "profile", "show", str(files[0]))
    assert code == 0 and "good" in out and "n1, n2" in out


def test_show_bad_file_exit_2_no_traceback(capsys, files):
    code, out, err = run(capsys, "profile", "show", str(files[1]))
    assert code == 2
    assert str(files[1]) in err and "`links.nvlink_gbytes_per_sec`" in err
    assert "did you mean `links.nvlink_gbytes_per_s`?" in err
    assert "Traceback" not in out + err


def test_show_unknown_name(capsys):
    code, _, err = run(capsys, "profile", "show", "dgx-h10")
    assert code == 2 and "did you mean 'dgx-h100'" in err


def test_validate_good(capsys, files):
    code, out, err = run(capsys, "profile", "validate", str(files[0]))
    assert code == 0 and out.strip() == f"ok {files[0]}" and not err


def test_validate_reports_every_file(capsys, files, tmp_path):
    good, typo, bad_hosts = files
    missing = tmp_path / "missing.yaml"
    code, out, err = run(capsys, "profile", "validate", str(typo), str(good), str(missing), str(tmp_path), str(bad_hosts))
    assert code == 2
    assert f"ok {good}" in out
    assert str(typo) in err and "did you mean `links.nvlink_gbytes_per_s`?" in err
    assert str(missing) in err and "no such file" in err
    assert "is a directory" in err
    assert "'n[x]'" in err  # hostlists are printed as given, not eaten as rich markup
    assert "4 of 5 profile file(s) are invalid" in err
    assert "Traceback" not in out + err


def test_validate_shipped_profiles(capsys):
    root = Path(__file__).resolve().parents[2] / "site_profiles"
    paths = sorted(str(p) for p in root.glob("*.yaml"))
    code, out, _ = run(capsys, "profile", "validate", *paths)
    assert code == 0 and out.count("ok ") == len(paths) == 4


def test_validate_needs_a_file(capsys):
    code, _, _ = run(capsys, "profile", "validate")
    assert code == 2


def test_list(capsys, tmp_path, monkeypatch):
    (tmp_path / "mine.toml").write_text('nodes = 1\ngpus_per_node = 1\n[links]\nnvlink_gbytes_per_s = 1\nnic_gbits_per_s = 1\n')
    (tmp_path / "broken.yaml").write_text("nodes: [\n")
    monkeypatch.setenv("RESHARDCTL_PROFILE_PATH", str(tmp_path))
    code, out, _ = run(capsys, "profile", "list")
    assert code == 0
    for name in ("local", "slurm-local", "dgx-h100", "gb200-nvl72", "mine", "broken"):
        assert name in out
    code, out, _ = run(capsys, "profile", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["dgx-h100"]["summary"] == "128 nodes x 8 GPUs"
    assert rows["broken"]["summary"].startswith("invalid")
    assert rows["mine"]["source"] == str(tmp_path / "mine.toml")


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed next to this python")
def test_installed_script_subprocess(files, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RESHARDCTL_PROFILE_PATH"}
    bad = subprocess.run([str(SCRIPT), "profile", "validate", str(files[1])],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2
    assert "did you mean `links.nvlink_gbytes_per_s`?" in bad.stderr and str(files[1]) in bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
    good = subprocess.run([str(SCRIPT), "profile", "show", "dgx-h100", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["derived"]["total_gpus"] == 1024
