"""A command line naming a command loads that command's module alone; help, completion and names that
are not commands load every command (cli.COMMANDS)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reshardctl.cli import COMMANDS, _command, main, named_command


@pytest.mark.parametrize("args, want", [
    (["plan", "--site", "local"], "plan"),
    (["-v", "-q", "plan"], "plan"),
    (["profile", "list"], "profile"),
    (["bench", "--help"], "bench"),
    ([], None),
    (["--help"], None),
    (["--version"], None),
    (["--show-completion", "bash"], None),  # a root option's value is not a command name
    (["plna"], None),  # not a command: every command loaded, so click can suggest the name
])
def test_named_command(args, want):
    assert named_command(args) == want


def test_completion_asks_for_every_command(monkeypatch):
    monkeypatch.setenv("_RESHARDCTL_COMPLETE", "complete_bash")
    assert named_command(["plan"]) is None


def test_every_command_or_only_the_one_named():
    assert set(_command().commands) == set(COMMANDS)
    assert list(_command("jobs").commands) == ["jobs"]


def test_plan_does_not_load_the_other_commands_modules():
    code = ("import sys, json; from reshardctl.cli import main; "
            "rc = main(['plan', '--site', 'local', '--model', 'tiny-llama', '--json']); "
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith('reshardctl.commands.'))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    rc, loaded = json.loads(out.splitlines()[-1])
    assert rc == 0
    others = {m for m, _ in COMMANDS.values()} - {COMMANDS["plan"][0]}
    assert others and not others & set(loaded), sorted(others & set(loaded))


def test_unknown_command_still_suggests(capsys):
    assert main(["plna"]) == 2
    assert "Did you mean 'plan'" in capsys.readouterr().err


def _modules_after(argv: list[str]) -> tuple[int, list[str]]:
    code = ("import sys, json; from reshardctl.cli import main; "
            f"rc = main({argv!r}); "
            "print(json.dumps([rc, sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.'))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    rc, loaded = json.loads(out.splitlines()[-1])
    return rc, loaded


def test_plan_json_does_not_load_rich_and_the_table_does():
    """``--json`` prints JSON only: no console, no table, no progress bar is made (output.py, progress.py
    import rich where they make one); the report as a table loads it."""
    rc, loaded = _modules_after(["plan", "--site", "local", "--model", "tiny-llama", "--json"])
    assert rc == 0 and loaded == [], loaded
    rc, loaded = _modules_after(["plan", "--site", "local", "--model", "tiny-llama"])
    assert rc == 0 and "rich.table" in loaded and "rich.console" in loaded, loaded
