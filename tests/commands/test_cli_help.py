"""Help screens are not errors: `reshardctl` and every sub-app without arguments print help, exit 0."""

from __future__ import annotations

import pytest

from reshardctl.cli import main


@pytest.mark.parametrize("argv", [[], ["profile"], ["layout"], ["model"]])
def test_bare_command_prints_help_and_exits_0(capsys, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Usage: reshardctl" in out and "Commands" in out and err == ""


def test_usage_errors_still_exit_2(capsys):
    assert main(["bogus"]) == 2
    assert main(["profile", "show", "--bogus"]) == 2
    capsys.readouterr()


def test_verbose_help_says_what_it_does(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "More detail" not in out and "tracebacks" in out
