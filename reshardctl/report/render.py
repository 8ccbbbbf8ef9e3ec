"""Write a report: plots first (into staged files), then the page; everything appears together or not at all."""

from __future__ import annotations

import tempfile
from pathlib import Path

from reshardctl.atomic_write import StagedWrites
from reshardctl.errors import InputError, OutputError
from reshardctl.report import page
from reshardctl.report.collect import load_runs

FORMATS = ("md", "html")


def default_out(run_dirs: list[str]) -> Path:
    return Path(run_dirs[-1]) / "report"


def write_report(run_dirs: list[str], out: str | None = None, fmt: str = "md") -> list[Path]:
    """The files written: ``report.md`` and its PNGs, or one ``report.html``."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    runs = load_runs(run_dirs)  # bad run directories: exit 2 before anything is written
    target = Path(out) if out is not None else default_out(run_dirs)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"--out {target}: cannot create the report directory: {exc.strerror or exc}") from None
    names = {"latency": "latency.png"}
    for i in range(len(runs)):
        names[f"timeline-{i}"] = f"timeline-{i + 1}.png"
        names[f"bytes-{i}"] = f"bytes-{i + 1}.png"
    blocks = page.build(runs, names)
    from reshardctl.report import plots  # matplotlib: imported only when a report is drawn (~0.5 s)

    with tempfile.TemporaryDirectory(prefix=".report-", dir=target) as tmp:
        d = Path(tmp)
        plots.latency(runs, d / names["latency"])
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
