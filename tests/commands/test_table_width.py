"""Tables that fit the terminal (``output.print_table``): at 80 and 120 columns no value is cut ("262..."),
no line is wider than the width, and a column left out to fit is named in a footnote line."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from reshardctl.cli import main
from reshardctl.commands import output
from reshardctl.commands.plan import _b, _s
from reshardctl.commands.run import render as render_summary
from reshardctl.commands.model import human_bytes, human_count

WIDTHS = (80, 120)


def _cli(capsys, monkeypatch, width: int, *args: str) -> tuple[str, object]:
    """The command's text at ``width`` columns (stdout piped: COLUMNS), and its --json output."""
    monkeypatch.setenv("COLUMNS", str(width))
    assert main([*args]) == 0
    text = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def _fits(text: str, width: int, header: str) -> None:
    """Nothing cut, and the table (its header line to the first blank or prose line) within ``width``;
    prose lines are soft-wrapped by the terminal."""
    assert "…" not in text and "..." not in text, text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    table = [line for line in lines[start:] if "  " in line.strip()]
    too_wide = [line for line in table if len(line.rstrip()) > width]
    assert not too_wide, f"table lines wider than {width}: {too_wide}"


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_table_keeps_every_number_whole(capsys, monkeypatch, width):
    text, res = _cli(capsys, monkeypatch, width, "plan", "--model", "qwen2.5-7b")
    _fits(text, width, "transport")
    for name, r in res["transports"].items():
        row = next(line for line in text.splitlines() if line.startswith(name))
        for value in (_b(r["bytes_moved"]), f"{r['transfers']:,}", _s(r["predicted_s"]), _b(r["max_staging_bytes"])):
            assert value in row, (value, row)
    if width == 80:  # the busiest-step column does not fit beside the numbers: left out, and said so
        assert "left out to fit 80 columns: busiest step" in text
    else:
        assert "left out" not in text and "node_nic_send" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_model_tables_keep_every_number_whole(capsys, monkeypatch, width):
    text, rows = _cli(capsys, monkeypatch, width, "model", "list")
    _fits(text, width, "preset")
    for r in rows:
        row = next(line for line in text.splitlines() if line.split()[:1] == [r["name"]])
        for value in (str(r["dims"]["num_layers"]), human_count(r["num_params"]), human_bytes(r["num_bytes"])):
            assert value in row.split() or value in row, (value, row)
    text, m = _cli(capsys, monkeypatch, width, "model", "show", "qwen2.5-7b")
    _fits(text, width, "role")
    for role, v in m["roles"].items():
        row = next(line for line in text.splitlines() if line.startswith(role + " "))
        for value in (f"{v['tensors']:,}", f"{v['params']:,}", f"{v['bytes']:,}"):
            assert value in row.split(), (value, row)


@pytest.mark.parametrize("width", WIDTHS)
def test_profile_list_fits(capsys, monkeypatch, width):
    text, rows = _cli(capsys, monkeypatch, width, "profile", "list")
    _fits(text, width, "name")
    for r in rows:
        assert r["summary"] in text and r["name"] in text


def _summary(median: float) -> dict:
    """A run summary as summary.json holds it (the fields the results table reads)."""
    t = {"refit_s": {"median": median, "p90": median * 1.1}, "transfer_s": {"median": median / 2},
         "verify_s": {"median": 0.0123}, "effective_gbps": 1234.56, "raw_baseline_s": median / 3,
         "transfer_vs_raw": 0.42, "predicted_s": 262.123, "measured_vs_predicted": 1.98,
         "peak_staging_bytes": 123456789012, "verified": True, "failures": []}
    return {"ok": True, "transports": {"reshard": t, "gather_broadcast": {**t, "refit_s": {"median": 2 * median,
                                                                                           "p90": 3 * median}}},
            "speedup_vs_reshard": {"reshard": 1.0, "gather_broadcast": 2.0}, "cost_figures": "datasheet", "run_dir": "/tmp/r"}


@pytest.mark.parametrize("width", WIDTHS)
def test_run_results_table_keeps_the_headline_numbers(capsys, monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    s = _summary(262.5)
    render_summary(s)
    text = capsys.readouterr().out
    _fits(text, width, "transport")
    row = next(line for line in text.splitlines() if line.startswith("gather_broadcast"))
    for value in ("525.00 s", "787.50 s", "2.00x slower", "1.98"):
        assert value in row, (value, row)
    if width == 80:
        assert re.search(r"left out to fit 80 columns: .*GB/s", text)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.lists(st.from_regex(r"[0-9][0-9,.]{0,14}", fullmatch=True), min_size=5, max_size=5),
                       min_size=1, max_size=4),
       notes=st.lists(st.text("abc def", min_size=0, max_size=60), min_size=4, max_size=4),
       width=st.integers(60, 160))
def test_fit_table_never_cuts_a_value(values, notes, width):
    """Values wider than the terminal lose secondary columns, never digits: each value of a kept column
    appears whole on its row, and each column dropped is named."""
    cols = ("v0", "v1", "v2", "v3", "v4", "note")
    t = output.table(*cols, text=("note",))
    for row, note in zip(values, notes * 2):
        t.add_row(*row, note)
    con = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=True)
    secondary = ("note", "v4", "v3", "v2")
    output.print_table(t, secondary, con)
    text = con.file.getvalue()
    kept = [c.header for c in t.columns]
    assert "…" not in text
    dropped = [c for c in secondary if c not in kept]
    assert kept == [c for c in cols if c not in dropped]
    assert dropped == list(secondary[:len(dropped)])  # in the order named
    lines = text.splitlines()
    if dropped:
        assert lines[-1] == f"(left out to fit {width} columns: {', '.join(dropped)}; --json has all)"
        lines = lines[:-1]
    assert all(len(line.rstrip()) <= width for line in lines), text
    for row in values:
        for c, v in zip(cols, row):
            if c in kept:
                assert any(v in line.split() for line in lines), (v, text)


@pytest.mark.parametrize("width", WIDTHS)
def test_profile_show_wraps_its_tree_and_keeps_the_link_figures(capsys, monkeypatch, width):
    text, p = _cli(capsys, monkeypatch, width, "profile", "show", "dgx-h100")
    assert "…" not in text
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not too_wide, too_wide  # the long lines (the calibration hint, the ledger path) wrap, not cut
    flat = " ".join(text.split())
    assert "reshardctl calibrate --site dgx-h100" in flat.replace("│ ", "")
    for value in (f"{p['links']['nvlink_gbytes_per_s']:g} GB/s", f"{p['links']['nvlink_latency_us']:g} us"):
        assert value in text, value


def _measure(transport: str, median: float, run_dir: str) -> dict:
    return {"v": 1, "time": "2026-01-01T00:00:00.000Z", "user": "u", "host": "h", "site": "local", "action": "measure",
            "transport": transport, "run_dir": run_dir, "plan_fingerprint": None, "median_s": median,
            "p90_s": median * 1.5, "budget_s": 5.0, "verdict": "within_budget", "reason": None}


@pytest.mark.parametrize("width", WIDTHS)
def test_status_table_wraps_the_run_directory_not_the_numbers(tmp_path, capsys, monkeypatch, width):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ledger = tmp_path / "state" / "reshardctl" / "local.ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    run_dir = str(tmp_path / ("a-long-run-directory-name-" * 3) / "bench-2026-01-01")
    ledger.write_text("".join(json.dumps(_measure(t, m, run_dir)) + "\n"
                              for t, m in (("gather_broadcast", 2.62123), ("reshard", 0.0123456))))
    text, st = _cli(capsys, monkeypatch, width, "status", "--site", "local")
    _fits(text, width, "transport")
    from reshardctl.runbook.gate import seconds

    for t, e in st["latest_measured"].items():
        row = next(line for line in text.splitlines() if line.startswith(t + " "))
        for value in (seconds(e["median_s"]), seconds(e["p90_s"])):
            assert value in row, (value, row)
    assert run_dir in "".join(line.strip() for line in text.splitlines())  # wrapped, whole


@pytest.mark.parametrize("width", WIDTHS)
def test_jobs_table_keeps_job_ids_whole_and_wraps_the_run_directory(cluster, tmp_path, capsys, monkeypatch, width):
    """Two runs in the per-user run index whose jobs the queue no longer knows (state UNKNOWN)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    index = tmp_path / "state" / "reshardctl" / "slurm-runs.jsonl"
    index.parent.mkdir(parents=True)
    runs = [{"run_dir": str(tmp_path / ("a-long-run-directory-name-" * 3) / str(i)), "site": "slurm-local",
             "job_ids": {"train": str(99999990 + i), "infer": str(99999980 + i)}, "submitted_at": 1796134121.88,
             "mode": "two-jobs"} for i in range(2)]
    index.write_text("".join(json.dumps(r) + "\n" for r in runs))
    text, rows = _cli(capsys, monkeypatch, width, "jobs", "--all")
    _fits(text, width, "submitted (UTC)")
    lines = text.splitlines()
    at = lines[0].index("run directory")  # the last column: its wrapped pieces, read top to bottom
    last = "".join(line[at:].strip() for line in lines[1:] if not line.startswith("(left out"))
    for r in rows:
        row = next(line for line in lines if ", ".join(r["job_ids"].values()) in line)
        assert r["submitted"] in row
        assert r["run_dir"] in last
