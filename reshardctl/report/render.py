"""Write a report: plots first (into staged files), then the page; everything appears together or not at all.

The run directories come from the command line, or (``--site`` without any) from the site's ledger: every
run directory its entries name that is still on disk, oldest first (``history.week_run_dirs``); the report
then goes to ``./reshardctl-report-<site>/`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from reshardctl.atomic_write import StagedWrites
from reshardctl.errors import InputError, OutputError
from reshardctl.report import history, page
from reshardctl.report.collect import RunData, load_runs

FORMATS = ("md", "html")


def default_out(given: str, last: RunData, site_name: str | None = None) -> Path:
    """``<last RUN_DIR>/report`` (an API refit's ``events_dir``, even given as its ``events/``: beside
    ``events/``); a site's week (no RUN_DIR): ``./reshardctl-report-<site>``."""
    if site_name is not None:
        return Path(f"reshardctl-report-{re.sub(r'[^A-Za-z0-9_.-]', '_', site_name)}")
    if last.api and last.run_dir.name == "events":
        return Path(given).parent / "report"
    return Path(given) / "report"


def _week(site: str) -> tuple[list[str], list[str], history.SiteLedger]:
    led = history.read_site(site)  # a corrupt ledger: LedgerError, exit 2
    if not led.entries:
        raise InputError(f"report --site {site}: nothing to report: {led.note or f'the ledger {led.path} is empty'}",
                         hint="give run directories, or bench / promote on this site first")
    here, gone = history.week_run_dirs(led.entries)
    if not here:
        raise InputError(f"report --site {site}: none of the {len(gone)} run directories the ledger {led.path} "
                         f"names is still on disk: {', '.join(gone)}")
    return here, gone, led


def write_report(run_dirs: list[str], out: str | None = None, fmt: str = "md", site: str | None = None) -> list[Path]:
    """The files written: ``report.md`` and its PNGs, or one ``report.html``. ``site``: the site profile
    whose budget and ledger the report reads (default: each run's own); without ``run_dirs``, the runs its
    ledger names."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    gone: list[str] = []
    week = None
    if not run_dirs:
        if site is None:
            raise InputError("report: give run directories, or --site for the runs of a site's ledger")
        run_dirs, gone, week = _week(site)
    runs = load_runs(run_dirs)  # bad run directories: exit 2 before anything is written
    ledgers = history.site_ledgers(runs, site)  # a corrupt ledger: exit 2 before anything is written
    histories = history.histories(runs, ledgers, site)
    target = Path(out) if out is not None else default_out(run_dirs[-1], runs[-1], week.site if week else None)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {target}: cannot create the report directory: {exc.strerror or exc}") from None
    names = {"history": "latency-over-time.png", "latency": "latency.png"}
    for i in range(len(runs)):
        names[f"timeline-{i}"] = f"timeline-{i + 1}.png"
        names[f"bytes-{i}"] = f"bytes-{i + 1}.png"
    blocks = page.build(runs, names, histories, ledgers, site, gone)
    budgets = {h.budget_s for h in histories if h.budget_s is not None}
    from reshardctl.report import plots  # matplotlib: imported only when a report is drawn (~0.5 s)

    with tempfile.TemporaryDirectory(prefix=".report-", dir=target) as tmp:
        d = Path(tmp)
        plots.latency_over_time(histories, d / names["history"])
        plots.latency(runs, d / names["latency"], budgets.pop() if len(budgets) == 1 else None)
        for i, run in enumerate(runs):
            plots.timeline(run, d / names[f"timeline-{i}"])
            plots.bytes_per_rank(run, d / names[f"bytes-{i}"])
        with StagedWrites() as staged:
            if fmt == "html":
                staged.file(target / "report.html").write_text(page.to_html(blocks, d))
            else:
                staged.file(target / "report.md").write_text(page.to_markdown(blocks))
                for name in names.values():
                    staged.file(target / name).write_bytes((d / name).read_bytes())
            written = [target / ("report.html" if fmt == "html" else "report.md")]
            if fmt == "md":
                written += [target / n for n in names.values()]
    return written
