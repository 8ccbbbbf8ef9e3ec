"""A finished run directory as evidence: its summary, and the inputs that re-plan it.

``summary.json`` fields are read with ``.get``: sessions from newer code may add fields (a Slurm
section, a predicted-time breakdown) and older ones may lack some. The inputs that produced the run are
recovered from ``command.txt`` (the exact `reshardctl run` / `bench` command line) parsed by the same
click options the command used, so the re-plan sees the same flags, layout files and bucket size.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reshardctl.errors import InputError

# the prepare() arguments a run's plan depends on (and a validation refit reuses)
PLAN_ARGS = ("model", "layers", "train", "infer", "train_style", "infer_style", "train_layout", "infer_layout",
             "bucket_mb", "relay")
ROOT_FLAGS = {"-v", "--verbose", "-q", "--quiet"}


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    summary: dict[str, Any]

    @property
    def inputs(self) -> dict[str, Any]:
        return self.summary.get("inputs") or {}

    @property
    def site(self) -> str | None:
        return self.inputs.get("site")

    @property
    def model(self) -> str | None:
        return self.inputs.get("model")

    @property
    def layouts(self) -> tuple[str | None, str | None]:
        return self.inputs.get("train"), self.inputs.get("infer")

    @property
    def transports(self) -> dict[str, dict]:
        return self.summary.get("transports") or {}

    def figure(self, transport: str, key: str = "median") -> float | None:
        s = self.transports.get(transport) or {}
        v = (s.get("refit_s") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else None

    def verified(self, transport: str) -> bool:
        s = self.transports.get(transport) or {}
        return bool(s.get("verified")) and not s.get("failures") and (s.get("iterations") or 0) > 0

    def fingerprint(self, transport: str) -> str | None:
        return (self.transports.get(transport) or {}).get("fingerprint")


def load_run(run_dir: str | Path, flag: str = "--run") -> RunRecord:
    path = Path(run_dir)
    f = path / "summary.json"
    if not path.is_dir():
        raise InputError(f"{flag} {run_dir}: no such run directory")
    try:
        summary = json.loads(f.read_text())
    except FileNotFoundError:
        raise InputError(f"{flag} {run_dir}: no summary.json (not a run directory of `reshardctl run`/`bench`, "
                         "or the run was interrupted before it was summarised)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{flag} {run_dir}: summary.json cannot be read: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("transports"), dict):
        raise InputError(f"{flag} {run_dir}: summary.json has no `transports` mapping")
    return RunRecord(path.resolve(), summary)


def _click_command(name: str):
    import typer

    from reshardctl.commands.run import bench_cmd, run_cmd

    app = typer.Typer()
    app.command(name)(bench_cmd if name == "bench" else run_cmd)
    return typer.main.get_command(app)


def replay_args(run: RunRecord) -> dict[str, Any]:
    """The ``prepare()`` arguments (``PLAN_ARGS``) of the command that produced ``run``. The model is the
    absolute path summary.json recorded when that path still exists (a relative path on the command
    line was relative to a working directory that is not recorded)."""
    f = run.run_dir / "command.txt"
    try:
        argv = shlex.split(f.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"run {run.run_dir}: command.txt cannot be read: {exc}") from None
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
