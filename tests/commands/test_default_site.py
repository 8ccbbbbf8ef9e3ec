"""The default site (reshardctl/site/default_site.py): --site, then RESHARDCTL_SITE, then site in
$XDG_CONFIG_HOME/reshardctl/config.toml, then local (status/promote/rollback: required); `profile show`
says which; a bad config file is exit 2 naming the file and the key."""

from __future__ import annotations

import json

import pytest

from reshardctl.cli import main


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Writes the user config file (in a private XDG_CONFIG_HOME) and returns its path; no
    RESHARDCTL_SITE."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("RESHARDCTL_SITE", raising=False)
    path = tmp_path / "cfg" / "reshardctl" / "config.toml"
    path.parent.mkdir(parents=True)

    def write(text: str):
        path.write_text(text)
        return path

    return write


def _plan_site(capsys, *args: str) -> str:
    assert main(["plan", "--model", "tiny-llama", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["inputs"]["site"]


def _shown(capsys, *args: str) -> dict:
    assert main(["profile", "show", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_nothing_set_is_local(config, capsys):
    assert _plan_site(capsys) == "local"
    shown = _shown(capsys)
    assert shown["site"] == "local" and shown["chosen_by"]["source"] == "default"


def test_config_file_then_env_then_flag(config, capsys, monkeypatch):
    path = config('site = "slurm-local"\n')
    assert _plan_site(capsys) == "slurm-local"
    shown = _shown(capsys)
    assert shown["site"] == "slurm-local" and shown["chosen_by"] == {
        "source": "config", "text": f"site from {path}", "file": str(path)}
    monkeypatch.setenv("RESHARDCTL_SITE", "dgx-h100")  # the environment beats the file
    assert _plan_site(capsys) == "dgx-h100"
    assert main(["profile", "show"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "site from RESHARDCTL_SITE"
    assert _plan_site(capsys, "--site", "local") == "local"  # the flag beats both
    assert _shown(capsys, "gb200-nvl72")["chosen_by"]["source"] == "flag"


def test_runbook_commands_need_a_site_from_somewhere(config, capsys, monkeypatch, tmp_path):
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "status needs a site" in err and "RESHARDCTL_SITE" in err and "config.toml" in err
    monkeypatch.setenv("RESHARDCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("RESHARDCTL_SITE", "local")
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["site"] == "local"


@pytest.mark.parametrize("text, words", [
    ("site = 3\n", ["key 'site'", "expected a non-empty string", "got 3 (int)"]),
    ('site = ""\n', ["key 'site'", "expected a non-empty string", "got ''"]),
    ('sit = "local"\n', ["unknown key(s) 'sit'", "expected only: site"]),
    ("site = \n", ["TOML syntax error"]),
])
def test_a_bad_config_file_is_exit_2_naming_file_and_key(config, capsys, text, words):
    path = config(text)
    assert main(["plan", "--model", "tiny-llama"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert str(path) in err and all(w in err for w in words), err
    assert main(["profile", "show", "--json"]) == 2  # the JSON error names them too
    e = json.loads(capsys.readouterr().out)["error"]
    assert e["exit_code"] == 2 and str(path) in e["message"]


def test_a_bad_config_file_is_not_read_when_the_site_is_given(config, capsys):
    config("site = 3\n")
    assert _plan_site(capsys, "--site", "local") == "local"
