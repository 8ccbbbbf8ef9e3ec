"""Slurm jobs of a refit session: write the scripts, submit, watch, cancel, read the ranks' reports.

The request (``slurm_request.py``) is pure; this module is the only one that submits it (for the Slurm
launcher, ``slurm_launcher.py``), and every
Slurm command goes through ``slurm_cli.py``. What a run directory holds for Slurm::

    session.pkl            the session file the ranks load (``runtime/session_file.py``; ``python -m reshardctl.runtime.worker --session``)
    slurm/*.sbatch         the job scripts, as submitted
    slurm/jobs.json        mode, job ids per role, submit time (written right after submission)
    slurm/<role>.jobid     two-jobs mode: each job's id, so that each can cancel the other
    slurm/job-<id>.out     the batch script's own output (two-jobs: train-<id>.out, infer-<id>.out)
    logs/rank-N.{out,err}  each rank's stdout and stderr
    reports/rank-N.json    each rank's report (written by the rank)
    events/rank-N.jsonl    each rank's events (written by the rank)

Every directory there is 0700 and every file 0600: the session submits under umask 077, which Slurm
gives the job and its output file, and the scripts set ``umask 077`` themselves (docs/runs.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from reshardctl.atomic_write import write_json_atomic, write_text_atomic
from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import InputError, LaunchError, RecordError, TransferError
from reshardctl.launch import slurm_cli
from reshardctl.launch.cancellation import cancellation, record_cancel
from reshardctl.launch.failures import lost_record, order_failures
from reshardctl.launch.slurm_failure import tail_lines
from reshardctl.launch.slurm_request import SlurmRequest
from reshardctl.runs.records import events_path, parse_event, read_json_object, run_events
from reshardctl.runtime.contract import RankReport, rank_report_from_dict
from reshardctl.topology import side_of_global, train_world_of

JOBS_FILE = "slurm/jobs.json"
POLL_S = 0.5
SACCT_LAG_S = 15.0  # accounting rows complete up to a few seconds after a job left the queue
MAX_JOBS_BYTES = 1 << 20  # slurm/jobs.json
MAX_REPORT_BYTES = 64 << 20  # reports/rank-N.json


@dataclass
class SlurmRun:
    """The jobs of one run, as recorded in ``slurm/jobs.json``."""

    run_dir: str
    mode: str
    job_ids: dict[str, str]  # "het" -> id (hetjob) | "train"/"infer" -> id (two-jobs)
    submitted_at: float
    scripts: list[str] = field(default_factory=list)
    world: int = 0

    @property
    def ids(self) -> list[str]:
        return list(self.job_ids.values())

    def components(self) -> dict[str, int]:
        """Job id -> the components accounting must record (a het job: trainers and inference)."""
        return {j: (2 if self.mode == "hetjob" else 1) for j in self.job_ids.values()}

    def save(self) -> None:
        write_json_atomic(Path(self.run_dir) / JOBS_FILE, asdict(self), mode=0o600, indent=2)

    @classmethod
    def load(cls, run_dir: str | Path) -> "SlurmRun":
        """The jobs of ``run_dir``; ``InputError`` (exit 2) for a missing, special, oversized or malformed
        ``slurm/jobs.json``, and for a job id that is not a Slurm job id (before any command sees it)."""
        path = Path(run_dir) / JOBS_FILE
        data = read_json_object(path, MAX_JOBS_BYTES, missing=f"{run_dir}: not a Slurm run directory (no {JOBS_FILE})")
        if set(data) - set(cls.__dataclass_fields__):
            raise InputError(f"{path}: expected a JSON object with keys {', '.join(cls.__dataclass_fields__)}")
        kinds = {"run_dir": str, "mode": str, "job_ids": dict, "submitted_at": (int, float), "scripts": list,
                 "world": int}
        for key, kind in kinds.items():
            if key in data and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
                raise InputError(f"{path}: `{key}` has the wrong type: {str(data[key])[:80]!r}")
        if data.get("mode") not in ("hetjob", "two-jobs"):
            raise InputError(f"{path}: `mode` must be hetjob or two-jobs, got {str(data.get('mode'))[:80]!r}")
        for role, job in (data.get("job_ids") or {}).items():
            slurm_cli.check_job_id(job, f"{path}: `job_ids.{role}`")
        try:
            return cls(**data)
        except TypeError as exc:  # a key missing
            raise InputError(f"{path}: {exc}") from None


def hand_job_ids(run_dir: Path, job: str) -> tuple[str, dict[str, str]]:
    """The mode and role -> job id of jobs submitted by hand from `reshardctl plan --out DIR`'s scripts:
    ``--job ID`` for a het job (``hetjob.sbatch``), ``--job TRAIN_ID,INFER_ID`` for two jobs
    (``train.sbatch`` then ``infer.sbatch``). ``InputError`` (before any command runs) otherwise."""
    ids = slurm_cli.check_job_ids([j.strip() for j in job.split(",")], "--job")
    scripts = {p.name for p in (Path(run_dir) / "slurm").glob("*.sbatch")}
    if "hetjob.sbatch" in scripts:
        if len(ids) != 1:
            raise InputError(f"--job {job}: {run_dir} was planned as one het job (slurm/hetjob.sbatch): give its "
                             f"one job id, got {len(ids)}")
        return "hetjob", {"het": ids[0]}
    if {"train.sbatch", "infer.sbatch"} <= scripts:
        if len(ids) != 2:
            raise InputError(f"--job {job}: {run_dir} was planned as two jobs (slurm/train.sbatch, slurm/infer.sbatch): "
                             f"give both job ids, the trainer job's first: --job TRAIN_ID,INFER_ID",
                             hint="squeue --me shows them; a job id alone would track one of the two jobs")
        if ids[0] == ids[1]:
            raise InputError(f"--job {job}: the trainer and inference jobs are two jobs with two ids")
        return "two-jobs", {"train": ids[0], "infer": ids[1]}
    raise InputError(f"--job {job}: {run_dir}/slurm holds no job scripts of `reshardctl plan --out` "
                     f"(hetjob.sbatch, or train.sbatch and infer.sbatch)")


def adopt(run_dir: Path, job: str, *, world: int) -> SlurmRun:
    """Record jobs submitted by hand (from `reshardctl plan --out DIR`'s scripts) as this run's
    (``hand_job_ids``)."""
    mode, ids = hand_job_ids(run_dir, job)
    scripts = sorted(str(p) for p in (Path(run_dir) / "slurm").glob("*.sbatch"))
    run = SlurmRun(str(run_dir), mode, ids, time.time(), scripts, world)
    run.save()
    if mode == "two-jobs":  # each job's script reads the other's id (cancel it on failure, show its state)
        for role, j in ids.items():
            write_text_atomic(Path(run_dir) / "slurm" / f"{role}.jobid", j + "\n", mode=0o600)
    return run


def cancel_run(run: SlurmRun) -> tuple[dict[str, str], list[str]]:
    """``reshardctl cancel``: each job's state just before (the queue's, else accounting's, else
    UNKNOWN), and the jobs cancelled: those still pending or running. Who cancelled them and when is
    recorded first (launch/cancellation.py), so a summary written later says so."""
    live = job_states(run.ids)
    ended = [j for j in run.ids if j not in live]
    acct = final_states(ended, wait_s=0.0) if ended else {}
    before = {j: (live.get(j) or acct.get(j) or slurm_cli.JobState(j, "UNKNOWN")).state for j in run.ids}
    cancel = [j for j in run.ids if j in live and not live[j].terminal and live[j].state != "COMPLETING"]
    if cancel:
        record_cancel(run.run_dir, {j: before[j] for j in cancel})
        slurm_cli.scancel(cancel)
    return before, cancel


def write_scripts(request: SlurmRequest) -> list[Path]:
    d = Path(request.run_dir) / "slurm"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    out = []
    for name, text in request.materialize().items():  # read by sbatch, never executed: 0600
        out.append(write_text_atomic(d / name, text, mode=0o600))
    return out


def submit(request: SlurmRequest) -> SlurmRun:
    """Write the scripts and submit them; ``slurm/jobs.json`` records the ids. Two-jobs: the trainer
    job first, the inference job held until it started (``--dependency=after``); when the inference job
    cannot be submitted, the trainer job is cancelled. A file the
    disk refuses once a job is submitted (``jobs.json``, a ``<role>.jobid``: full, read-only) would lose
    its id: the submitted jobs are cancelled, and the ``RecordError`` names the file and the job ids
    (with the ``scancel`` to run by hand should the cancel itself fail)."""
    world = request.train_world + request.infer_world
    run = SlurmRun(request.run_dir, request.mode, {}, time.time(), [], world)
    try:
        run.scripts = [str(p) for p in write_scripts(request)]
        if request.mode == "hetjob":
            run.job_ids["het"] = slurm_cli.sbatch(request.submit_argv("hetjob.sbatch"))
        else:
            slurm_dir = Path(request.run_dir) / "slurm"
            for role in ("train", "infer"):
                # the inference job is held until the trainer job has started (which then waits for it)
                argv = request.submit_argv(f"{role}.sbatch", after=run.job_ids.get("train") if role == "infer" else None)
                run.job_ids[role] = slurm_cli.sbatch(argv)
                write_text_atomic(slurm_dir / f"{role}.jobid", run.job_ids[role] + "\n", mode=0o600)
        run.save()
    except LaunchError:
        slurm_cli.scancel(run.ids)  # the trainer job of a two-jobs run whose inference job was refused
        raise
    except OSError as exc:
        raise _unrecorded(run, exc) from None
    return run


def _unrecorded(run: SlurmRun, exc: OSError) -> RecordError:
    """The error of a submission whose record the disk refused: the jobs cancelled (their ids named)."""
    what = f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)
    if not run.ids:
        return RecordError(f"{what}: the Slurm scripts could not be written; nothing was submitted",
                           hint="free space (or make it writable), or choose another --out")
    ids = ", ".join(run.ids)
    try:
        slurm_cli.scancel(run.ids)
        done = f"cancelled Slurm job(s) {ids}, which nothing would have tracked"
    except LaunchError as cancel:
        done = (f"and cancelling Slurm job(s) {ids} failed too ({cancel}): cancel them by hand with "
                f"`scancel {' '.join(run.ids)}`")
    return RecordError(f"{what}: the job ids of the submitted run could not be recorded; {done}",
                       hint=f"free space (or make it writable) under {run.run_dir}, then run it again")


@dataclass
class Watch:
    """What watching saw: the final state per job, and when the jobs started and ended."""

    states: dict[str, slurm_cli.JobState]
    first_running_at: float | None
    ended_at: float
    interrupted: bool = False
    cancelled_peer: str | None = None


def job_states(ids: list[str]) -> dict[str, slurm_cli.JobState]:
    """The state of each job id (a het job: its components' states folded: the worst wins)."""
    q = slurm_cli.squeue(ids)
    out = {}
    for j in ids:
        comps = [s for k, s in q.items() if k == j or k.startswith(j + "+")]
        if comps:
            out[j] = _fold(j, comps)
    return out


def _fold(job: str, comps: list[slurm_cli.JobState]) -> slurm_cli.JobState:
    bad = [c for c in comps if c.terminal and c.state != "COMPLETED"]
    if bad:
        return slurm_cli.JobState(job, bad[0].state, bad[0].reason, _nodes(comps), bad[0].exit_code,
                                  comps[0].submit, comps[0].start, comps[0].end, comps[0].elapsed_s,
                                  cancelled_by=bad[0].cancelled_by)
    states = {c.state for c in comps}
    state = "PENDING" if "PENDING" in states else ("RUNNING" if states & {"RUNNING", "CONFIGURING", "COMPLETING"}
                                                   else comps[0].state)
    reason = next((c.reason for c in comps if c.state == "PENDING"), comps[0].reason)
    return slurm_cli.JobState(job, state, reason, _nodes(comps), comps[0].exit_code,
                              comps[0].submit, comps[0].start, comps[0].end, comps[0].elapsed_s)


COMPONENT_SEP = " + "  # between a het job's components' node lists (a node list may hold commas)


def _nodes(comps: list[slurm_cli.JobState]) -> str:
    """A het job's node lists in component order (``12+0`` first), ``COMPONENT_SEP`` between them."""
    return COMPONENT_SEP.join(c.nodes for c in sorted(comps, key=lambda c: c.job_id))


def final_states(ids: list[str], *, wait_s: float = SACCT_LAG_S,
                 components: Mapping[str, int] | None = None) -> dict[str, slurm_cli.JobState]:
    """Accounting's final record of each job (sacct), polled until every job has a terminal state (and,
    for a het job, all ``components[job]`` of its components) or ``wait_s`` passed: accounting lags
    the queue by a few seconds, and a het job's second component may be recorded after its first."""
    end = time.monotonic() + wait_s
    got: dict[str, slurm_cli.JobState] = {}
    seen: dict[str, int] = {}
    want = dict(components or {})
    while True:
        acct = slurm_cli.sacct(ids)
        for j in ids:
            comps = [s for k, s in acct.items() if k == j or k.startswith(j + "+")]
            if comps:
                got[j] = _fold(j, comps)
                seen[j] = len(comps)
        if all(j in got and got[j].terminal and seen[j] >= want.get(j, 1) for j in ids) or time.monotonic() > end:
            return got
        time.sleep(0.5)


def _one_failed(ids: list[str], states: dict[str, slurm_cli.JobState]) -> bool:
    """Has one of the jobs ended without success? A job that left the queue is judged by accounting
    (a COMPLETED trainer job that ends a moment before its inference job is no failure)."""
    for j in ids:
        s = states.get(j)
        if s is None:
            acct = final_states([j], wait_s=0.0).get(j)
            if acct is not None and acct.terminal and acct.state != "COMPLETED":
                return True
        elif s.terminal and s.state != "COMPLETED":
            return True
    return False


def watch(run: SlurmRun, on_update: Callable[[dict[str, slurm_cli.JobState]], None] | None = None) -> Watch:
    """Poll the queue until every job of ``run`` has left it (or ended). Two-jobs: when one job ends
    without success while the other still waits or runs, cancel the other. Ctrl-C cancels every job
    (the ``KeyboardInterrupt`` is re-raised after the cancel)."""
    ids = run.ids
    first_running = None
    cancelled_peer = None
    last: dict[str, slurm_cli.JobState] = {}
    try:
        while True:
            states = job_states(ids)
            if states:
                last.update(states)
            if first_running is None and states and all(s.state in ("RUNNING", "COMPLETING", "COMPLETED")
                                                         or s.terminal for s in states.values()) \
                    and len(states) == len(ids):
                first_running = time.time()
            if on_update is not None:
                on_update(states)
            live = {j: s for j, s in states.items() if not s.terminal and s.state != "COMPLETING"}
            if run.mode == "two-jobs" and cancelled_peer is None and live and len(live) < len(ids):
                if _one_failed(ids, states):
                    cancelled_peer = ",".join(live)
                    slurm_cli.scancel(list(live))
            if not live:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        slurm_cli.scancel(ids)
        raise
    if first_running is None and last and any(s.state != "PENDING" for s in last.values()):
        first_running = time.time()  # started and ended between two polls
    return Watch(final_states(ids, components=run.components()), first_running, time.time(),
                 cancelled_peer=cancelled_peer)


def _last_words(run_dir: Path, rank: int, cancelled: bool = False) -> str:
    """What a rank that left no report said last: its stderr's last lines, else its last event."""
    err = tail_lines(run_dir / "logs" / f"rank-{rank}.err")
    if err:
        return "; its stderr ends:\n      " + err.replace("\n", "\n      ")
    e = parse_event(tail_lines(events_path(run_dir, rank), 1))
    if e:
        step = f" of step {e['step']}" if e.get("step") is not None else ""
        return f" (stopped after its {e.get('phase')} phase{step}; no stderr)"
    return " and wrote nothing before the job was cancelled" if cancelled else " and wrote nothing (it never started?)"


def read_reports(run_dir: Path, world: int, names: list[str], *,
                 cancelled: bool = False) -> tuple[dict[str, list[RankReport]], dict[int, str]]:
    """The ranks' reports (``reports/rank-N.json``): ``{plan name: reports in rank order}`` of the ranks
    that reported, and ``{rank: why}`` for those that did not (with their stderr's last lines;
    ``cancelled``: the run was cancelled, which is why a rank may have written nothing)."""
    by_rank: dict[int, dict[str, RankReport]] = {}
    lost: dict[int, str] = {}
    for r in range(world):
        path = run_dir / "reports" / f"rank-{r}.json"
        try:
            data = loads_json(read_text(path, MAX_REPORT_BYTES))
        except LoadError:
            lost[r] = "left no report" + _last_words(run_dir, r, cancelled)
            continue
        if not isinstance(data, dict):
            lost[r] = f"left a report that is not a JSON object ({path})"
            continue
        if "global_rank" in data:  # a one-plan report
            data = {names[0]: data}
        by_rank[r] = {n: rank_report_from_dict(d) for n, d in data.items()}
    session = {n: [by_rank[r][n] for r in sorted(by_rank) if n in by_rank[r]] for n in names}
    return session, lost


def failure_records(session: Mapping[str, list[RankReport]], lost: Mapping[int, str],
                    run_dir: Path | None = None) -> list[dict]:
    """Failure records, root cause first (``launch/failures.py``): ranks without a report (where they
    were: the last event each wrote), then the failing transport's ranks that failed on their own, then
    the knock-on failures."""
    world_t = next((train_world_of(r.global_rank, r.side_rank) for rs in session.values() for r in rs
                    if r.side == "infer"), None)
    recs = []
    for rank, why in sorted(lost.items()):
        side, side_rank = (None, None) if world_t is None else side_of_global(rank, world_t)
        recs.append(lost_record(rank, side, side_rank, None, 0.0, why, run_dir))
    failing = next((rs for rs in session.values() if any(not r.ok for r in rs)), [])
    return order_failures(recs, failing) if (recs or failing) else []


def who_cancelled(run: SlurmRun, w: Watch) -> dict | None:
    """Who cancelled the run and when (launch/cancellation.py), unless this tool's own watch cancelled it
    (Ctrl-C or a signal to an attached run: ``w.interrupted``, said by the interrupt itself)."""
    return None if w.interrupted else cancellation(run.run_dir, run.ids, w.states, w.cancelled_peer)


def slurm_record(run: SlurmRun, w: Watch | None, run_dir: Path) -> dict:
    """The ``slurm`` section of ``summary.json``."""
    rec: dict = {"mode": run.mode, "job_ids": dict(run.job_ids), "submitted_at": run.submitted_at,
                 "scripts": [os.path.basename(s) for s in run.scripts]}
    if w is None:
        return rec
    rec["states"] = {j: s.state for j, s in w.states.items()}
    rec["exit_codes"] = {j: s.exit_code for j, s in w.states.items()}
    rec["nodes"] = _side_nodes(run, w)
    rec["interrupted"] = w.interrupted
    cancelled = who_cancelled(run, w)
    if cancelled:
        rec["interrupted"] = True
        rec["cancelled"] = cancelled
    if w.cancelled_peer:
        rec["cancelled_peer"] = w.cancelled_peer
    started = w.first_running_at
    if started is None:  # not watched from the submission (a detached run): accounting's start time
        started = _earliest_start(w.states)
    if started is not None:
        rec["queue_s"] = max(0.0, started - run.submitted_at)
        ready = _ranks_ready_at(run_dir)
        if ready is not None:
            rec["startup_s"] = max(0.0, ready - started)
            rec["run_s"] = max(0.0, w.ended_at - ready)
    return rec


def _earliest_start(states: Mapping[str, slurm_cli.JobState]) -> float | None:
    """The earliest ``Start`` of the jobs (sacct's local ISO time, 1 s resolution), unix time."""
    import datetime as dt

    starts = []
    for s in states.values():
        try:
            starts.append(dt.datetime.fromisoformat(s.start).timestamp())
        except (TypeError, ValueError):
            continue
    return min(starts) if starts else None


def _side_nodes(run: SlurmRun, w: Watch) -> dict[str, str]:
    if run.mode == "hetjob":
        parts = [s for s in w.states.values()]
        nodes = parts[0].nodes.split(COMPONENT_SEP) if parts else []
        # het components fold in component order: trainers (+0) first
        return {"train": nodes[0] if nodes else "", "infer": nodes[1] if len(nodes) > 1 else ""}
    return {role: w.states[j].nodes if j in w.states else "" for role, j in run.job_ids.items()}


def _ranks_ready_at(run_dir: Path) -> float | None:
    """When the last rank finished setting up its process groups (from the events), unix time."""
    ends = []
    for e in run_events(run_dir):
        start, took = e.get("start"), e.get("duration_s")
        if e.get("phase") == "group_init" and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in (start, took)):
            ends.append(start + took)
    return max(ends) if ends else None


class SlurmRunError(TransferError):
    """A refit session on Slurm failed; ``session`` holds the reports of the ranks that reported."""

    def __init__(self, message: str, session: dict[str, list[RankReport]] | None = None):
        super().__init__(message)
        self.session = session or {}
