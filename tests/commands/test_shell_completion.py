"""Shell completion is on: ``reshardctl --show-completion`` prints the script, and the script's protocol
(``_RESHARDCTL_COMPLETE``) completes commands and options."""

from __future__ import annotations

from reshardctl.cli import main


def test_show_completion_bash_prints_a_script_naming_reshardctl(capsys, monkeypatch):
    # typer's switch to take the shell from the command line, not from the parent process (which under
    # pytest is not always a shell)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    assert main(["--show-completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert "complete -o default -F _reshardctl_completion reshardctl" in out
    assert "_RESHARDCTL_COMPLETE=complete_bash" in out


def test_completion_protocol_completes_commands_and_options(capsys, monkeypatch):
    monkeypatch.setenv("_RESHARDCTL_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "reshardctl pro")
    monkeypatch.setenv("COMP_CWORD", "1")
    main([])
    assert capsys.readouterr().out.split() == ["promote", "profile"]
    monkeypatch.setenv("COMP_WORDS", "reshardctl plan --mo")
    monkeypatch.setenv("COMP_CWORD", "2")
    main([])
    assert capsys.readouterr().out.split() == ["--model"]
