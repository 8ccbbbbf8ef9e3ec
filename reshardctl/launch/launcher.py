"""One interface for every launcher, and the registry that maps a launcher's name to it.

A session (``runs/session.py``) prepares a run (plans, checks, the run directory) and hands it to its
launcher as a ``LaunchJob``; the launcher starts the ranks, watches them and returns an ``Outcome``
(the ranks' reports, the error, the failures root cause first, the summary's launcher section); the
session writes ``summary.json`` from it. The session never asks which launcher it holds. Two
implementations: ``launch/local_launcher.py`` (every rank a process on this machine) and
``launch/slurm_launcher.py`` (Slurm jobs). Each ships the same session file to its ranks
(``launch/session_file.py``: the planner's plans; each rank derives its own steps).
"""

from __future__ import annotations

import importlib
import shlex
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol

from reshardctl.errors import InputError, ReshardError
from reshardctl.plan.refit_plan import Plan
from reshardctl.request.resolve import Inputs
from reshardctl.runtime.contract import RunOptions

# name -> "module:class"; imported when a session names it (the local launcher needs torch, the
# Slurm one does not: `reshardctl plan --out`, `jobs` and `collect` never load torch)
_REGISTRY = {"local": "reshardctl.launch.local_launcher:LocalLauncher",
             "slurm": "reshardctl.launch.slurm_launcher:SlurmLauncher"}
LAUNCHERS = tuple(_REGISTRY)
DEFAULT = "local"

Progress = Callable[[int, int, str], None]  # (done, total, what)


@dataclass(frozen=True)
class LaunchJob:
    """What a session hands its launcher: the prepared run."""

    inp: Inputs
    plans: Mapping[str, Plan]
    fallback: Plan | None  # the gather-and-broadcast plan of --on-failure fallback
    options: RunOptions
    warmup: int
    run_dir: Path
    ctx: dict  # session.json
    who: dict  # run.json's started_by
    started: float
    mode: str | None = None  # the launcher's own mode option (Slurm: hetjob | two-jobs)
    detach: bool = False

    @property
    def label(self) -> str:
        """As the run directory is named: ``bench``, or the one transport."""
        return "bench" if self.options.baseline else next(iter(self.plans))


@dataclass
class Outcome:
    """How a launched (or collected) run ended, for ``summary.json`` and ``run.json``."""

    reports: dict | None  # {transport: [RankReport]} of the ranks that reported
    error: ReshardError | None
    wall_s: float
    failures: list[dict] = field(default_factory=list)  # root cause first (launch/failures.py)
    interrupted: bool = False
    extra: dict = field(default_factory=dict)  # summary.json's launcher keys, after the common ones
    handle: object | None = None  # what the launcher started (a SlurmRun), for `--detach` and the CLI
    detached: bool = False  # returned once started: no summary yet (collected later)
    started_at: float | None = None  # run.json's started_at in its final state (default: the session's)
    raise_after: ReshardError | None = None  # raised once the summary is written (instead of returned)
    until_written: ExitStack | None = None  # entered by the launcher, closed once the summary is written


@dataclass(frozen=True)
class DryRun:
    """What a launcher would start, without starting or writing anything."""

    mode: str
    run_dir: str
    scripts: dict[str, str]  # name -> text
    paths: dict[str, str]  # name -> where it would be written
    submit: list[list[str]]  # the argv that would start it

    def to_json(self) -> dict:
        return {"mode": self.mode, "run_dir": self.run_dir, "scripts": self.scripts, "submit": self.submit}

    def text(self) -> str:
        """The scripts, each under a ``# ---- <path>`` line, then the argv that would start them."""
        parts = [f"# ---- {self.paths[n]}\n{t}" for n, t in self.scripts.items()]
        parts.append("# ---- submit (dry run: nothing was submitted or written)\n")
        parts += [shlex.join(a) + "\n" for a in self.submit]
        return "".join(parts)


class Launcher(Protocol):
    """A way to start a session's ranks. Implementations: ``LocalLauncher``, ``SlurmLauncher``."""

    name: str
    starting_state: str  # run.json's state while the launcher starts the ranks

    def check(self, topology) -> None:
        """Refuse (``InputError``) worlds this launcher cannot run, before anything is planned or written."""

    def check_detach(self) -> None:
        """Refuse (``InputError``) ``--detach`` where the launcher cannot return before its ranks end."""

    def memory_estimate(self, inp: Inputs, plans: Mapping[str, Plan]) -> int | None:
        """Bytes the ranks need where the launcher runs them (refused when they cannot fit), or None."""

    def dry_run(self, inp: Inputs, transports: list[str], *, out: str | None, mode: str | None,
                baseline: bool, timeout_s: float | None, retries: int) -> DryRun:
        """What would be started for these inputs: printable, nothing started or written."""

    def files(self, inp: Inputs, plans: Mapping[str, Plan], run_dir: Path, *, iterations: int, warmup: int,
              mode: str | None) -> dict[str, str | bytes]:
        """The files (name relative to ``run_dir`` -> content) for starting the run by hand."""

    def prepare(self, job: LaunchJob) -> None:
        """Write what the ranks load, in the run directory (an ``OSError`` there: nothing was started)."""

    def run(self, job: LaunchJob, *, progress: Progress | None, stop, on_state) -> Outcome:
        """Start the ranks and watch them to the end (``stop``: an Event that ends the run early;
        ``progress(done, total, what)``; ``on_state(states, commits)``: a queue's states), or return once
        started (``job.detach``). Returns the outcome; raises ``LaunchError`` when nothing could start."""

    def recorded(self, run_dir: Path, job: str | None) -> bool:
        """Does ``run_dir`` record this launcher's jobs (or is ``job`` one of its job ids)?"""

    def check_collect(self, run_dir: Path, job: str | None) -> None:
        """Refuse collecting ``run_dir`` (``job``: a job id given for it) before anything is read or run."""

    def collect(self, run_dir: Path, ctx: dict, *, wait: bool, job: str | None, on_state) -> Outcome:
        """The outcome of a run started earlier whose launcher did not write its summary."""

    def settle(self, run_dir: Path, live: dict, finish: Callable[[dict, Outcome], None],
               read_context: Callable[[Path], dict]) -> str | None:
        """A run whose launcher is gone and whose ranks ended (``live``: the queue's states): its outcome to
        ``finish(session.json, outcome)``, which writes the summary; returns run.json's new state, or None
        when there is nothing to settle (yet)."""


def launcher_for(name: str) -> Launcher:
    """The launcher named ``name`` (``local``, ``slurm``); ``InputError`` for any other name."""
    where = _REGISTRY.get(name)
    if where is None:
        raise InputError(f"--launcher {name!r}: expected one of {', '.join(LAUNCHERS)}")
    module, cls = where.split(":")
    return getattr(importlib.import_module(module), cls)()


def launcher_of_run(run_dir: Path, job: str | None = None) -> Launcher:
    """The launcher whose jobs ``run_dir`` records (``job``: a job submitted by hand for it); the local
    launcher when none does."""
    for name in LAUNCHERS:
        if name != DEFAULT:  # the default one is not loaded to be asked (the local launcher loads torch)
            impl = launcher_for(name)
            if impl.recorded(run_dir, job):
                return impl
    return launcher_for(DEFAULT)
