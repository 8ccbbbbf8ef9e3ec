"""`reshardctl jobs`, `reshardctl cancel RUN_DIR`, `reshardctl collect RUN_DIR`: detached Slurm runs."""

from __future__ import annotations

import time
from typing import Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError, LaunchError


def jobs_cmd(
    all_runs: bool = typer.Option(False, "--all", help="Also runs whose jobs ended (default: only those still queued or running)."),
    as_json: bool = opt.JSON,
) -> None:
    """This tool's Slurm runs (from the per-user run index) with their jobs' state."""
    from reshardctl.launch import slurm
    from reshardctl.launch.run_index import list_runs, state_dir
    from reshardctl.runs.collect import settle_run

    runs = list_runs()
    ids = [j for r in runs for j in r["job_ids"].values()]
    live = slurm.job_states(ids) if ids else {}
    for r in runs:  # a run whose jobs ended but whose launcher never wrote how: collected now
        try:
            settle_run(r["run_dir"], live, "slurm")
        except InputError as exc:  # its run.json is no file reshardctl wrote (a FIFO, a device): skipped
            output.err_console().print(f"note: {r['run_dir']} not settled: {exc}", markup=False, highlight=False)
    ended = [j for j in ids if j not in live]
    acct = slurm.final_states(ended, wait_s=0.0) if (ended and all_runs) else {}
    rows = []
    for r in runs:
        states = {j: (live.get(j) or acct.get(j)) for j in r["job_ids"].values()}
        active = any(j in live and not live[j].terminal for j in r["job_ids"].values())
        if not (active or all_runs):
            continue
        rows.append({
            "run_dir": r["run_dir"], "site": r.get("site"), "mode": r.get("mode"), "job_ids": r["job_ids"],
            "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.get("submitted_at", 0))),
            "states": {j: (s.state if s else "UNKNOWN") for j, s in states.items()},
            "reasons": {j: s.reason for j, s in states.items() if s and s.state == "PENDING"},
        })
    if as_json:
        output.print_json(rows)
        return
    if not rows:
        what = "runs" if all_runs else "queued or running runs (--all shows ended ones)"
        output.console().print(f"no {what} in {state_dir()}", markup=False, highlight=False)
        return
    table = output.table("submitted (UTC)", "site", "mode", "jobs", "state", "run directory",
                         text=("state", "run directory"))
    for r in rows:
        st = ", ".join(s + (f" ({r['reasons'][j]})" if j in r["reasons"] else "") for j, s in r["states"].items())
        table.add_row(r["submitted"], str(r["site"]), str(r["mode"]), ", ".join(r["job_ids"].values()), st,
                      r["run_dir"])
    output.print_table(table, ("site", "mode"))


def cancel_cmd(run_dir: str = typer.Argument(..., help="The run directory of a Slurm run.")) -> None:
    """Cancel the Slurm jobs of a run that are still queued or running (both jobs of a two-jobs run); say
    each job's state. Exit 0 when a job was cancelled, 1 when every job had ended already."""
    from reshardctl.launch import slurm

    run = slurm.SlurmRun.load(run_dir)
    before, cancelled = slurm.cancel_run(run)
    roles = {j: role for role, j in run.job_ids.items()}
    lines = [f"Slurm job {j} ({roles[j]}): {before[j]} -> cancelled" if j in cancelled else
             f"Slurm job {j} ({roles[j]}): {before[j]}, ended already: nothing to cancel" for j in run.ids]
    if not cancelled:
        raise LaunchError(f"nothing cancelled in {run_dir}: every job of the run ended already\n  " + "\n  ".join(lines))
    output.console().print("\n".join(lines) + f"\ncancelled {len(cancelled)} Slurm job(s) of {run_dir}",
                           markup=False, highlight=False)


def collect_cmd(
    run_dir: str = typer.Argument(..., help="The run directory of a Slurm run."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the jobs ended (default: refuse while they run)."),
    job: Optional[str] = typer.Option(None, "--job", help="Job id(s) of a run submitted by hand from `plan --out DIR` scripts: ID (het job) or TRAIN_ID,INFER_ID (two jobs)."),
    as_json: bool = opt.JSON,
) -> None:
    """Build summary.json of a detached Slurm run once its jobs ended, and print the refit table. Exit 3
    (nothing collected) while its jobs are queued or running, unless --wait."""
    from reshardctl.commands.progress import LiveProgress, session_end_line
    from reshardctl.commands.run import show_summary
    from reshardctl.runs.collect import collect_session

    # --wait: the queue's states while the jobs run, then their end state
    prog = LiveProgress(output.err_console(), "waiting for the run's jobs", enabled=wait and not as_json and not output.quiet())
    res = None

    def on_state(states: dict) -> None:
        prog.start()  # at the first state: a run refused for its inputs prints its error alone
        prog.state(states)

    try:
        res = collect_session(run_dir, wait=wait, job=job, on_state=on_state if wait else None)
    finally:
        prog.stop(None if res is None else session_end_line(res.summary))
    show_summary(res, as_json)
