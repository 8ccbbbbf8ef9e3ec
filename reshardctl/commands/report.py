"""`reshardctl report [RUN_DIR...] [--site S]`: the runbook page of runs and API refits, with the site's
budget and ledger decisions; ``--site`` alone: the runs the site's ledger names (its week)."""

from __future__ import annotations

from typing import List, Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.site.default_site import choose_site


def report_cmd(
    run_dirs: Optional[List[str]] = typer.Argument(
        None, help="Run directories or API refits' events_dir (several: over time, before/after, in order)."),
    site: Optional[str] = typer.Option(
        None, "--site", metavar="NAME|FILE",
        help="Site profile whose budget and ledger the report reads (default: each run's own). Without RUN_DIR: "
             "report every run directory its ledger names that is still on disk (site: --site, else "
             "$RESHARDCTL_SITE, else site in the user config file)."),
    out: Optional[str] = typer.Option(
        None, "--out", help="Report directory (default: <last RUN_DIR>/report; --site alone: "
                            "./reshardctl-report-<site>)."),
    fmt: str = typer.Option("md", "--format", help="md (report.md + PNGs) | html (one self-contained report.html)."),
    as_json: bool = opt.JSON,
) -> None:
    """Markdown or HTML page with plots: within budget and what changed, predicted vs measured, timelines."""
    from reshardctl.report.render import write_report

    if not run_dirs and site is None:  # the default site's week; none configured: exit 2 saying how to name one
        site = choose_site(None, required=True, what="report without RUN_DIR").site
    files = write_report(list(run_dirs or []), out, fmt, site)
    if as_json:
        output.print_json({"files": [str(f) for f in files]})
        return
    for f in files:
        output.console().print(str(f), markup=False, highlight=False)
