"""`reshardctl trace RUN_DIR [--out FILE]`: a run's events as a Chrome/Perfetto trace (report/trace.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from reshardctl.atomic_write import output_problem, write_json_atomic
from reshardctl.bounded_load import LoadError
from reshardctl.commands import output
from reshardctl.errors import InputError, OutputError


def find_event_logs(run_dir: Path) -> list[Path]:
    """The ``rank-N.jsonl`` logs under ``events/`` of a run directory or of an API refit's ``events_dir``
    (the same layout, without ``summary.json``), or in the ``events/`` directory itself; ``InputError``
    naming the directory when it has none."""
    from reshardctl.runs.records import event_logs, events_dir  # when it runs: cli.py imports every command

    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory (give a run directory or an API refit's events_dir)")
    logs = event_logs(events_dir(run_dir)) or event_logs(run_dir)
    if not logs:
        raise InputError(f"{run_dir}: no event logs: neither {events_dir(run_dir)}/rank-N.jsonl (a run directory "
                         "or an API refit's events_dir) nor rank-N.jsonl in it")
    return logs


def check_output(out: Path) -> None:
    why = output_problem(out)
    if why:
        raise OutputError(f"--out {out}: {why}")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise OutputError(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"--out {out}: directory {parent} is not writable")


def trace_cmd(
    run_dir: str = typer.Argument(..., help="A run directory (its events/), or an API refit's events_dir."),
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="FILE",
                                      help="The trace file (default: RUN_DIR/trace.json)."),
) -> None:
    """The run's events as a Chrome trace (JSON): open it at ui.perfetto.dev or chrome://tracing."""
    from reshardctl.report.trace import build_trace
    from reshardctl.runs.records import read_events_tolerant

    d = Path(run_dir)
    logs = find_event_logs(d)
    target = Path(out) if out is not None else d / "trace.json"
    check_output(target)
    events: list[dict] = []
    bad, skipped = 0, []
    for f in logs:
        try:
            ev, n = read_events_tolerant(f)
        except LoadError as exc:
            skipped.append(f"{f}: {exc} (skipped)")
            continue
        events.extend(ev)
        bad += n
    trace = build_trace(events, name=str(d.resolve().name), skipped_lines=bad, skipped_logs=skipped)
    info = trace["otherData"]
    if not info["events"]:
        raise InputError(f"{run_dir}: no readable events in {len(logs)} log(s)"
                         + (f" ({'; '.join(skipped)})" if skipped else ""))
    try:
        write_json_atomic(target, trace, mode=0o600)  # the events it is made of are the run owner's alone
    except OSError as exc:
        raise OutputError(f"--out {target}: cannot be written: {exc.strerror or exc}") from None
    for line in skipped:
        output.info(f"warning: {line}")
    if bad:
        output.info(f"warning: {bad} event line(s) that are not events skipped")
    output.console().print(str(target), markup=False, highlight=False)
    output.info(f"{info['events']} events of {info['ranks']} ranks; open it at https://ui.perfetto.dev "
                "(Open trace file) or chrome://tracing")
