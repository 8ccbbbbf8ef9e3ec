"""Every command that prints a table (or a list a script would parse) takes --json."""

from __future__ import annotations

import json
from pathlib import Path

from reshardctl.cli import _command, main

# the commands whose text output is a table or a list of results
TABLE_COMMANDS = ("plan", "run", "bench", "jobs", "collect", "status", "promote", "calibrate", "selftest", "report",
                  "profile show", "profile list", "model show", "model list", "layout show")


def test_every_table_command_takes_json():
    root = _command()
    lacking = []
    for name in TABLE_COMMANDS:
        cmd = root
        for part in name.split():
            cmd = cmd.commands[part]
        if not any("--json" in p.opts for p in cmd.params):
            lacking.append(name)
    assert lacking == []


def test_report_json_lists_the_files_it_wrote(tmp_path, small_llama, capsys):
    run = tmp_path / "run"
    assert main(["run", "--model", small_llama, "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert files and all(Path(f).is_file() and Path(f).is_relative_to(tmp_path / "rep") for f in files)
    assert any(f.endswith("report.md") for f in files)
