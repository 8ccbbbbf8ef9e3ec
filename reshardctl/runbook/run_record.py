"""A finished run directory as evidence: its summary, and the inputs that re-plan it.

``summary.json`` is read, typed and checked by ``runs/records.py`` (``read_summary``: fields read
with ``.get``, since sessions from newer code may add fields and older ones may lack some). The inputs
that produced the run are recovered from ``command.txt`` (the exact `reshardctl run` / `bench` command line) parsed by the same
click options the command used, so the re-plan sees the same flags, layout files and bucket size.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, read_text
from reshardctl.errors import InputError
from reshardctl.runs.records import SummaryRecord, read_summary

# the prepare() arguments a run's plan depends on (and a validation refit reuses)
PLAN_ARGS = ("model", "layers", "train", "infer", "train_style", "infer_style", "train_layout", "infer_layout",
             "bucket_mb", "relay")
ROOT_FLAGS = {"-v", "--verbose", "-q", "--quiet"}
MAX_COMMAND_BYTES = 1 << 20  # command.txt: one command line


RunRecord = SummaryRecord  # a finished run as evidence: summary.json, typed and checked (runs/records.py)


def load_run(run_dir: str | Path, flag: str = "--run") -> RunRecord:
    """``summary.json`` of ``run_dir`` as evidence (``runs/records.read_summary``)."""
    return read_summary(run_dir, flag)


def _click_command(name: str):
    import typer

    from reshardctl.commands.run import bench_cmd, run_cmd

    app = typer.Typer()
    app.command(name)(bench_cmd if name == "bench" else run_cmd)
    return typer.main.get_command(app)


def read_command(run: RunRecord) -> list[str]:
    """The words of the run's ``command.txt`` (a regular file of at most ``MAX_COMMAND_BYTES``)."""
    f = run.run_dir / "command.txt"
    try:
        return shlex.split(read_text(f, MAX_COMMAND_BYTES))
    except (LoadError, ValueError) as exc:
        raise InputError(f"run {run.run_dir}: command.txt cannot be read: {exc}") from None


def replay_args(run: RunRecord, argv: list[str]) -> dict[str, Any]:
    """The ``prepare()`` arguments (``PLAN_ARGS``) of the command ``argv`` (``read_command``) that produced
    ``run``. The model is the absolute path summary.json recorded when that path still exists (a relative
    path on the command line was relative to a working directory that is not recorded)."""
    words = [w for w in argv[1:] if w not in ROOT_FLAGS]
    if not words or words[0] not in ("run", "bench"):
        raise InputError(f"run {run.run_dir}: command.txt is not a `reshardctl run` or `bench` command: {shlex.join(argv)}")
    cmd = _click_command(words[0])
    try:
        ctx = cmd.make_context(words[0], words[1:], resilient_parsing=True)
    except Exception as exc:  # noqa: BLE001 - click raises several kinds
        raise InputError(f"run {run.run_dir}: command.txt cannot be parsed: {exc}") from None
    params = {k: ctx.params.get(k) for k in PLAN_ARGS}
    for k in ("train_layout", "infer_layout"):  # recorded in the ledger: absolute when found from here
        if params[k] and Path(params[k]).is_file():
            params[k] = str(Path(params[k]).resolve())
    src = run.inputs.get("model_source")
    if isinstance(src, str) and Path(src).is_absolute() and Path(src).exists():
        params["model"] = src
    return params
