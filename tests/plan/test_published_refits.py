"""docs/cost-model.md "Predicted vs published" stays true: each row of its table is what reshardctl predicts
now (benchmarks/published_refits.py recomputes it), and a collective row's prediction is what ``reshardctl plan
--json`` shows. The rows that plan 256 + 256 ranks of DeepSeek-V3 or Qwen3-235B with the hybrid transport
(seconds each) run with RESHARDCTL_TEST_SLOW=1."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("published_refits", ROOT / "benchmarks" / "published_refits.py")
pub = sys.modules.setdefault("published_refits", importlib.util.module_from_spec(spec))
if not hasattr(pub, "ROWS"):  # (a dataclass module must be in sys.modules while it runs)
    spec.loader.exec_module(pub)


def doc_rows() -> list[str]:
    text = (ROOT / "docs" / "cost-model.md").read_text()
    table = text.split("<!-- published-refits:begin -->\n", 1)[1].split("\n<!-- published-refits:end -->", 1)[0]
    return table.splitlines()


def test_the_table_lists_every_row_once():
    lines = doc_rows()
    want = pub.markdown(rows=()).splitlines()
    assert lines[:2] == want  # the header
    assert len(lines) == 2 + len(pub.ROWS)
    assert all(line.startswith(f"| {r.source} | {r.what} | ") for line, r in zip(lines[2:], pub.ROWS))


def _check(rows) -> None:
    lines = dict(zip(pub.ROWS, doc_rows()[2:]))
    for r in rows:
        assert lines[r] == pub.markdown(rows=(r,)).splitlines()[2], (r.what, r.layouts)


def test_each_row_is_what_reshardctl_predicts_now():
    _check([r for r in pub.ROWS if not r.large])


@pytest.mark.skipif(os.environ.get("RESHARDCTL_TEST_SLOW") != "1", reason="RESHARDCTL_TEST_SLOW=1 plans the large rows")
def test_the_large_rows_too():
    _check([r for r in pub.ROWS if r.large])


def test_a_collective_row_is_what_plan_json_shows(capsys):
    """The Qwen3-235B row after PR 1379: ``reshardctl plan ... --bucket-mb 1638.4 --json`` carries the table's
    prediction in framework_refit.collective (the command benchmarks/published_refits.py names)."""
    from reshardctl.cli import main

    row = next(r for r in pub.ROWS if r.model == "qwen3-235b-a22b" and r.path == "collective" and r.buffers == 2)
    args = pub.command(row).split(": ")[0].split()[1:]
    assert main(args) == 0
    fr = json.loads(capsys.readouterr().out)["framework_refit"]["collective"]
    assert math.isclose(fr["predicted_s"], pub.predict(row), rel_tol=1e-12)
    assert fr["buffer_bytes"] == int(1638.4 * (1 << 20))
