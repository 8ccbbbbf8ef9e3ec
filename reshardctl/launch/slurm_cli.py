"""The one place reshardctl runs Slurm's commands: ``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``scontrol``.

Every call takes an argv list (never a shell string), a bounded time, and raises ``SlurmCommandError``
carrying the command, its exit code and stderr. Parsing of their output lives here too, so the rest of
the launcher deals in job ids and ``JobState`` records.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

from reshardctl.errors import InputError, LaunchError

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
DEFAULT_TIMEOUT_S = 30.0
# a Slurm job id: digits, with an optional array task (``12_3``) or het-job component (``12+1``) suffix
JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,9})?")
JOB_ID_FORM = "digits, optionally with an array task `_N` or a het component `+N` suffix, e.g. 1234, 1234_5, 1234+1"


class JobIdError(InputError):
    """A string that is not a Slurm job id (read from a file or typed): never passed to a command."""


def check_job_id(job: object, where: str) -> str:
    """``job`` when it is a Slurm job id (``JOB_ID``); ``JobIdError`` naming ``where`` otherwise. Every job
    id is checked before it reaches an argv, so none can become an option (``--user=root``)."""
    if not isinstance(job, str) or not JOB_ID.fullmatch(job):
        raise JobIdError(f"{where}: {str(job)[:80]!r} is not a Slurm job id ({JOB_ID_FORM})")
    return job


def check_job_ids(jobs: Iterable[object], where: str) -> list[str]:
    return [check_job_id(j, where) for j in jobs]


class SlurmCommandError(LaunchError):
    """A Slurm command failed or could not run. ``argv``, ``returncode`` and ``stderr`` say how."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, *, why: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        head = why or (f"exit code {returncode}" if returncode is not None else "did not run")
        detail = f": {self.stderr[-800:]}" if self.stderr else ""
        super().__init__(f"`{shlex.join(self.argv)}` failed ({head}){detail}")


def run(argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    """Run one Slurm command; its stdout/stderr as text. Raises ``SlurmCommandError`` on a missing
    command, a timeout, or (``check``) a non-zero exit."""
    argv = [str(a) for a in argv]
    if not argv or argv[0] not in COMMANDS:
        raise LaunchError(f"not a Slurm command: {argv[:1]}")
    if shutil.which(argv[0]) is None:
        raise SlurmCommandError(argv, None, "", why=f"`{argv[0]}` is not on PATH: is this a Slurm login node?")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SlurmCommandError(argv, None, err, why=f"no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise SlurmCommandError(argv, None, str(exc), why="could not start") from None
    if check and proc.returncode != 0:
        raise SlurmCommandError(argv, proc.returncode, proc.stderr)
    return proc


def sbatch(argv: Sequence[str]) -> str:
    """Submit (``argv`` from ``SlurmRequest.submit_argv``, with ``--parsable``); the job id."""
    out = run(argv, timeout_s=60.0).stdout.strip()
    job = out.split(";", 1)[0].strip()  # --parsable: "<id>" or "<id>;<cluster>"
    if not JOB_ID.fullmatch(job):
        raise SlurmCommandError(argv, 0, out, why=f"sbatch printed no job id ({out!r})")
    return job


def scancel(job_ids: Iterable[str]) -> None:
    ids = check_job_ids(job_ids, "scancel")
    if ids:
        run(["scancel", "--", *ids], check=False)  # an ended job is not an error


def hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames`` of a Slurm nodelist expression."""
    if not nodelist or nodelist in ("None assigned", "(null)"):
        return []
    return run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


@dataclass(frozen=True)
class JobState:
    """One job (or het-job component: ``12+0``) as Slurm reports it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""
    submit: str = ""
    start: str = ""
    end: str = ""
    elapsed_s: float | None = None
    cancelled_by: str = ""  # accounting's "CANCELLED by <uid>": the uid of whoever cancelled the job

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _base_state(state: str) -> str:
    return state.split()[0].rstrip("+") if state else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED


_CANCELLED_BY = re.compile(r"CANCELLED\+? by ([0-9]{1,10})")


def _cancelled_by(state: str) -> str:
    """The uid in accounting's ``CANCELLED by 1000`` ("" for any other state)."""
    m = _CANCELLED_BY.match(state.strip())
    return m.group(1) if m else ""


def squeue(job_ids: Sequence[str]) -> dict[str, JobState]:
    """Jobs still known to the controller (pending, running, just ended), by job id (het components as
    ``<id>+<k>``)."""
    if not job_ids:
        return {}
    fmt = "%i|%T|%r|%N"
    proc = run(["squeue", "-h", "-o", fmt, f"--jobs={','.join(check_job_ids(job_ids, 'squeue'))}"], check=False)
    if proc.returncode != 0:  # "Invalid job id specified": every job has left the queue
        if "Invalid job id" in proc.stderr:
            return {}
        raise SlurmCommandError(proc.args, proc.returncode, proc.stderr)
    out = {}
    for line in proc.stdout.splitlines():
        f = line.split("|")
        if len(f) >= 4:
            out[f[0]] = JobState(f[0], _base_state(f[1]), reason=f[2], nodes=f[3])
    return out


def sacct(job_ids: Sequence[str]) -> dict[str, JobState]:
    """Accounting records of jobs (allocations only, no steps), by job id; ``{}`` when accounting is off."""
    if not job_ids:
        return {}
    fields = "JobID,State,ExitCode,NodeList,Submit,Start,End,ElapsedRaw,Reason"
    proc = run(["sacct", "-n", "-P", "-X", f"--format={fields}", f"--jobs={','.join(check_job_ids(job_ids, 'sacct'))}"],
               check=False)
    if proc.returncode != 0:
        return {}
    out = {}
    for line in proc.stdout.splitlines():
        f = line.split("|")
        if len(f) < 9:
            continue
        try:
            elapsed = float(f[7]) if f[7] else None
        except ValueError:
            elapsed = None
        out[f[0]] = JobState(f[0], _base_state(f[1]), reason=f[8], nodes=f[3], exit_code=f[2], submit=f[4],
                             start=f[5], end=f[6], elapsed_s=elapsed, cancelled_by=_cancelled_by(f[1]))
    return out
