"""`reshardctl report RUN_DIR...`: the runbook page of one or several runs (before/after)."""

from __future__ import annotations

from typing import List, Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output


def report_cmd(
    run_dirs: List[str] = typer.Argument(..., help="Run directories (several: a before/after comparison, in order)."),
    out: Optional[str] = typer.Option(None, "--out", help="Report directory (default: <last RUN_DIR>/report)."),
    fmt: str = typer.Option("md", "--format", help="md (report.md + PNGs) | html (one self-contained report.html)."),
    as_json: bool = opt.JSON,
) -> None:
    """Markdown or HTML page with plots: predicted vs measured, speedup, lower bound, verification, timelines."""
    from reshardctl.report.render import write_report

    files = write_report(run_dirs, out, fmt)
    if as_json:
        output.print_json({"files": [str(f) for f in files]})
        return
    for f in files:
        output.console().print(str(f), markup=False, highlight=False)
