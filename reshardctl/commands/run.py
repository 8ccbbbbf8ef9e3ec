"""`reshardctl run` (one transport, for real) and `reshardctl bench` (all three side by side).

Both run every rank as a process on this machine (gloo on CPU, NCCL where each rank has a GPU) or, with
the Slurm launcher, as tasks of Slurm jobs (trainer and inference on separate allocations); both verify
every byte and leave a run directory (see reshardctl/runs/rundir.py and docs/slurm.md).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import List, Optional

import typer
from rich.markup import escape

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError, TransferError
from reshardctl.request.request import RefitRequest, RunSettings
from reshardctl.request.resolve import prepare
from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.runbook.transport_source import LedgerTransport, flag_record

ITERS = typer.Option(5, "--iters", min=1, help="Timed refits per transport.")
WARMUP = typer.Option(1, "--warmup", min=0, help="Untimed refits first (connections, buffers).")
OUT = typer.Option(None, "--out", "-o", metavar="DIR", help="Run directory (default runs/<UTC time>-<label>); an existing non-empty one is refused unless --force.")
FORCE = typer.Option(False, "--force", help="With --out: empty an existing non-empty run directory first.")
CHECKPOINT = typer.Option(None, "--checkpoint", help="safetensors checkpoint (file or dir): trainer ranks read their slices from it.")
FULL_CHECK = typer.Option(False, "--full-check", help="Also compare every destination box with the weight source (timed apart).")
LAUNCHER = typer.Option(None, "--launcher", help="local | slurm (default: the profile's launcher, else local).")
SLURM_MODE = typer.Option(None, "--slurm-mode", help="hetjob | two-jobs (default: the profile's slurm.mode, else hetjob).")
DRY_RUN = typer.Option(False, "--dry-run", help="Slurm: print the job scripts and the sbatch argv; submit nothing, write nothing.")
DETACH = typer.Option(False, "--detach", help="Slurm: submit, print the job ids and the run directory, return (see `reshardctl collect`).")
INJECT = typer.Option(None, "--inject", help="A fault drill, repeatable: kill:rank=5:phase=transfer, hang:rank=2:phase=verify, corrupt:rank=6, slow:rank=1:factor=4, exit:rank=3:phase=commit (docs/runbook-faults.md).")
RETRIES = typer.Option(0, "--retries", min=0, help="Retry a failed refit N times on freshly built process groups, after every rank settled.")
ON_FAILURE = typer.Option("abort", "--on-failure", help="abort | fallback (retries use gather-and-broadcast, decided before the first attempt).")
TIMEOUT = typer.Option(None, "--timeout-s", min=0.1, help="Bound on every blocking call (default: the profile's refit.timeout_s).")


def _s(x) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def _b(n) -> str:
    from reshardctl.commands.model import human_bytes

    return human_bytes(int(n))


def _session(request: RefitRequest, *, out, as_json, dry_run=False, detach=False, force=False, source=None):
    """Run ``request`` (its ``run`` settings say what and how) and show its summary. ``source``: who chose
    the transport (``transport_source`` of session.json and summary.json)."""
    # imported here, not at module level: every command's module is imported at start (cli.py)
    from reshardctl.commands.progress import LiveProgress, session_end_line  # rich.progress: 10-20 ms
    from reshardctl.launch.launcher import LAUNCHERS, launcher_for
    from reshardctl.runs.session import run_refit_session

    rs = request.run
    transports, launcher, slurm_mode, baseline = list(rs.transports), rs.launcher, rs.slurm_mode, rs.baseline
    timeout_s, retries = rs.timeout_s, rs.retries
    inp = prepare(request.replace(transport=transports[0] if len(transports) == 1 else "all"))
    # the session's transports, not "all" three: summary.json, plan.json and session.json list what ran
    inp = dataclasses.replace(inp, transports=tuple(transports), primary=transports[0])
    launcher = launcher or inp.site.launcher
    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    if launcher != "slurm" and (dry_run or detach or slurm_mode):
        flag = "--dry-run" if dry_run else ("--detach" if detach else "--slurm-mode")
        raise InputError(f"{flag} is a Slurm launcher option, but the launcher is {launcher!r} "
                         f"(add --launcher slurm, or set launcher: slurm in the site profile)")
    if dry_run:
        plan = launcher_for(launcher).dry_run(inp, transports, out=out, mode=slurm_mode, baseline=baseline,
                                              timeout_s=timeout_s, retries=retries)
        if as_json:
            output.print_json(plan.to_json())
        else:
            output.console().print(plan.text(), markup=False, highlight=False, end="")
        return None
    where = "Slurm tasks" if launcher == "slurm" else "processes"
    show = not as_json and not output.quiet()
    announced: list[bool] = []

    def announce(bar: bool = True) -> None:
        """What runs, said once the session has passed its checks (the first progress report, or its
        end): a run refused for its inputs (--out, --inject, memory) prints its error alone."""
        if announced or not show:
            return
        announced.append(True)
        output.info(f"{inp.model.name}: train {inp.train.describe()} -> infer {inp.infer.describe()} "
                    f"({inp.topology.world} {where}), transports {', '.join(transports)}")
        if not inp.site.cpu_only and launcher == "local":
            output.info(f"note: site {inp.site.name} describes GPUs; here every rank is a process on this machine "
                        f"(NCCL only where each rank has its own GPU, else gloo on CPU), so the measured times are "
                        f"this machine's, not the site's; `reshardctl plan` predicts the site")
        if bar:
            prog.start()

    def progress(done, total, what) -> None:
        announce()
        prog.update(done, total, what if launcher == "local" else None)

    def on_slurm_state(states, sides) -> None:
        announce()
        prog.state(states, sides)

    # started by announce(): an input error before the first report leaves no progress line behind
    prog = LiveProgress(output.err_console(), "starting ranks" if launcher == "local" else "submitting",
                        enabled=show)
    res = None
    try:
        res = run_refit_session(inp, list(transports), iterations=rs.iterations, warmup=rs.warmup, baseline=baseline,
                                out=out, force=force, checkpoint=rs.checkpoint, full_check=rs.full_check,
                                argv=output.argv(), inject=list(rs.inject) or None, retries=retries,
                                on_failure=rs.on_failure, timeout_s=timeout_s, progress=progress, launcher=launcher,
                                mode=slurm_mode, detach=detach, on_state=on_slurm_state, transport_source=source)
    finally:
        prog.stop(None if res is None else session_end_line(res.summary))
    announce(bar=False)  # a session that ended (or detached) before its first progress report
    if res.summary is None:  # detached
        run = res.launched
        info = {"run_dir": str(res.run_dir), "mode": run.mode, "job_ids": run.job_ids}
        if as_json:
            output.print_json(info)
        else:
            ids = ", ".join(f"{k} {v}" if k != "het" else v for k, v in run.job_ids.items())
            output.console().print(f"submitted Slurm job(s) {ids} ({run.mode}); run directory: {res.run_dir}\n"
                                   f"follow: reshardctl jobs; summary once ended: reshardctl collect {res.run_dir}",
                                   markup=False, highlight=False)
        return res
    show_summary(res, as_json)
    return res


def show_summary(res, as_json: bool) -> None:
    """The summary of a finished session (JSON, or the refit table), then its error, if any, raised."""
    if as_json:
        output.print_json(res.summary)
    else:
        render(res.summary)
    split = split_text(res.summary)
    if split is not None:  # never a success, and never only a line in summary.json
        raise TransferError(split if res.error is None else f"{split}\n{res.error}")
    if res.error is not None:
        raise res.error


def split_text(summary: dict) -> str | None:
    """``SPLIT: ...`` naming the inference ranks and the step each ends on, when they differ in any
    transport's ``committed_steps`` (the commit's repair could not make them agree: docs/commit-protocol.md)."""
    parts = []
    for name, s in (summary.get("transports") or {}).items():
        steps = s.get("committed_steps") or {}
        if len(set(steps.values())) <= 1:
            continue
        by: dict = {}
        for rank, step in sorted(steps.items(), key=lambda kv: int(kv[0])):
            by.setdefault(step, []).append(rank)
        parts.append(f"{name}: " + "; ".join(f"step {st} on rank(s) {', '.join(rs)}" for st, rs in by.items()))
    if not parts:
        return None
    return ("SPLIT: the inference ranks end on different weights (" + " | ".join(parts)
            + "); serve nothing from this run before every inference rank is refitted again")


def _versus(name: str, sp: dict) -> str:
    """``3.57x slower`` / ``1.20x faster`` than reshard (``-`` for reshard itself or unmeasured)."""
    x = sp.get(name)
    if name == "reshard" or not x:
        return "-"
    return f"{x:.2f}x slower" if x >= 1 else f"{1 / x:.2f}x faster"


def _table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the results table; a column with nothing to say (e.g. the raw ceiling of a
    run that did not measure it, "vs reshard" with one transport) is left out."""
    trs = summary["transports"]
    cols = ["transport", "refit median", "p90", "transfer", "verify", "GB/s", "vs reshard", "raw ceiling",
            "of ceiling", "predicted", "measured/pred.", "peak staging", "verified"]
    sp = summary.get("speedup_vs_reshard", {})
    rows = []
    for name, s in trs.items():
        raw, ratio = s.get("raw_baseline_s"), s.get("transfer_vs_raw")
        rows.append([
            escape(name), _s(s["refit_s"]["median"]), _s(s["refit_s"]["p90"]), _s(s["transfer_s"]["median"]),
            _s(s["verify_s"]["median"]), f"{s['effective_gbps']:.2f}", _versus(name, sp), _s(raw),
            f"{100 * ratio:.0f}%" if ratio else "-", _s(s["predicted_s"]),
            f"{s['measured_vs_predicted']:.2f}" if s.get("measured_vs_predicted") else "-",
            _b(s["peak_staging_bytes"]), "yes" if s["verified"] else "NO",
        ])
    keep = [j for j, c in enumerate(cols) if j == 0 or c == "verified" or any(r[j] != "-" for r in rows)]
    return [cols[j] for j in keep], [[r[j] for j in keep] for r in rows]


def comparison_line(summary: dict) -> str | None:
    """``reshard was 3.57x faster than gather_broadcast (median refit 12.0 ms vs 42.8 ms), both verified``."""
    trs, sp = summary["transports"], summary.get("speedup_vs_reshard", {})
    if "reshard" not in trs:
        return None
    for name, x in sp.items():
        if name == "reshard" or not x:
            continue
        a, b = trs["reshard"]["refit_s"]["median"], trs[name]["refit_s"]["median"]
        word = f"{x:.2f}x faster than" if x >= 1 else f"{1 / x:.2f}x slower than"
        ver = "both verified" if trs["reshard"]["verified"] and trs[name]["verified"] else "NOT both verified"
        return f"reshard was {word} {name} (median refit {_s(a)} vs {_s(b)}), {ver}"
    return None


# the last line of a successful run's summary: what to do next, per command (bench: the change window)
NEXT_STEPS = {
    "run": ("next: a bigger model (--model, see `reshardctl model list`), a layout of your own (--train-layout/"
            "--infer-layout FILE), on Slurm (--launcher slurm), or all three transports with the raw ceiling "
            "(`reshardctl bench`)"),
    "bench": ("next: `reshardctl promote --site {site} --run {run_dir}` makes reshard (--transport hybrid: hybrid) "
              "the site's refit transport if this run proves it (verified, median and p90 within the budget, faster "
              "than gather_broadcast); `reshardctl status --site {site}` shows the window, `reshardctl report "
              "{run_dir}` the page"),
}


def next_steps(summary: dict) -> str | None:
    """The ``next:`` line of a successful session: a bench run (``request.run.baseline``) points at the
    change window (promote, status, report), a run at bigger work (not on Slurm: it is already there)."""
    if not summary.get("ok"):
        return None
    req = summary.get("request") or {}
    if (req.get("run") or {}).get("baseline"):
        return NEXT_STEPS["bench"].format(site=shlex.quote(str(req.get("site") or "SITE")),
                                          run_dir=shlex.quote(str(summary["run_dir"])))
    return None if summary.get("slurm") else NEXT_STEPS["run"]


# the results table's columns dropped (in this order) when the terminal is too narrow for all
SECONDARY = ("verify", "GB/s", "of ceiling", "raw ceiling", "peak staging", "transfer", "predicted")


def render(summary: dict) -> None:
    con = output.console()
    trs = summary["transports"]
    cols, rows = _table_rows(summary)
    table = output.table(*cols, right=cols[1:])
    for r in rows:
        table.add_row(*r)
    output.print_table(table, SECONDARY, con)
    line = comparison_line(summary) if summary.get("ok") else None
    if line:
        con.print(line, markup=False, highlight=False)
    src = summary.get("transport_source")
    if src:
        con.print(source_line(src), markup=False, highlight=False)
    con.print(f"predicted from {summary.get('cost_figures', 'datasheet')} figures"
              + ("" if "calibration" in summary.get("cost_figures", "") else
                 " (no calibration: run `reshardctl calibrate` for this site's own figures)"), markup=False, highlight=False)
    for name, s in trs.items():
        br = s.get("predicted_breakdown_s") or {}
        if br:
            con.print(f"  {name} predicted: " + ", ".join(f"{k} {_s(v)}" for k, v in br.items()), markup=False,
                      highlight=False)
    for s in trs.values():  # measured/predicted outside 0.5-2x: the term most likely wrong (runs/summary.py)
        if (s.get("prediction_warning") or {}).get("message"):
            con.print(f"warning: {s['prediction_warning']['message']}", markup=False, highlight=False)
    sl = summary.get("slurm")
    if sl:
        ids = ", ".join(sl.get("job_ids", {}).values())
        states = ", ".join(f"{j} {st}" for j, st in sl.get("states", {}).items())
        times = " ".join(f"{k[:-2]} {_s(sl[k])}" for k in ("queue_s", "startup_s", "run_s") if sl.get(k) is not None)
        con.print(f"slurm ({sl.get('mode')}): job(s) {ids}: {states or 'no final state'}"
                  + (f"; {times}" if times else ""), markup=False, highlight=False)
    con.print(f"run directory: {summary['run_dir']}", markup=False, highlight=False)
    # a failed run: its error (the root cause once, the knock-on failures summarised) goes to stderr
    # alone (show_summary raises it); stdout keeps the measurements, here how fast the fault was seen
    det = summary.get("detection_s")
    if summary.get("root_cause") and det is not None and summary.get("knock_on_failures"):
        n = summary["knock_on_failures"]
        con.print(f"detection: {'the other rank' if n == 1 else f'all {n} other ranks'} stopped within {det:.2f} s "
                  f"of the fault (timeout {summary['timeout_s']:g} s)", markup=False, highlight=False)
    for name, s in trs.items():
        if summary.get("ok"):  # failures a retry got past (a failed run's own are its error, on stderr)
            for f in s["failures"][:5]:
                con.print(f"{name}: rank {f['rank']} ({f['side']} {f['side_rank']}): {f['error']}: {f['message']}",
                          markup=False)
        # the attempts, when there was more than one to tell apart (one failed attempt is the error itself)
        for a in (s.get("attempts") or [])[:10] if len(s.get("attempts") or []) > 1 else []:
            con.print(f"{name}: step {a['step']} attempt {a['attempt']} ({a['transport']}): {a['outcome']}",
                      markup=False)
    nxt = next_steps(summary)
    if nxt:
        con.print(nxt, markup=False, highlight=False)


def source_line(src: dict) -> str:
    """``transport gather_broadcast: the site's active transport, from its ledger (line 3: rollback by ana
    at ...)``: who chose the run's transport (summary.json ``transport_source``)."""
    t, by, e = src.get("transport"), src.get("decided_by"), src.get("ledger_entry") or {}
    if by == "flag":
        text = f"transport {t}: chosen by --transport"
    elif by == "ledger":
        text = (f"transport {t}: the site's active transport, from its ledger (line {e.get('line')}: "
                f"{e.get('action')} by {e.get('user')} at {e.get('time')})")
    else:
        text = f"transport {t}: the site's active transport, the profile's refit.transport (no promotion or rollback recorded)"
    return text + (f"; note: {src['note']}" if src.get("note") else "")


def _active(site: str) -> dict:
    """The site's active transport now (its ledger, else the profile), as a run records it; a ledger that
    cannot be used is said on stderr (even with --quiet) and the run goes on with the profile's transport."""
    def warn(text: str) -> None:
        output.err_console().print(f"warning: {text}", markup=False, highlight=False)

    return LedgerTransport(site, warn=warn)().record()


def default_transports(transport: str, *, explicit: bool, drills: bool) -> list[str]:
    """What `run` runs: ``--transport X`` runs X only; without it, a measurement run (no fault drill,
    retries or fallback) runs the profile's transport and then a comparison transport on the same
    processes, or the same Slurm allocation (gather-and-broadcast, or reshard where the profile's
    transport is gather-and-broadcast), so the first run shows the speedup, whatever the launcher.
    With drills/retries, the profile's transport only (a drill fires once, in the first transport)."""
    if explicit or drills:
        return [transport]
    return [transport, "reshard" if transport == "gather_broadcast" else "gather_broadcast"]


RUN_HELP_ORDER = ("site", "model", "layers", "train", "infer", "train_style", "infer_style", "train_layout",
                  "infer_layout", "transport", "bucket_mb", "relay", "iters", "warmup", "out", "force", "checkpoint",
                  "full_check", "as_json", "mtp")
BENCH_HELP_ORDER = RUN_HELP_ORDER[:9] + ("bucket_mb", "relay", "iters", "warmup", "out", "force", "as_json", "mtp")


@opt.refit_options(RUN_HELP_ORDER)
def run_cmd(
    request: RefitRequest,
    transport: Optional[str] = typer.Option(None, "--transport", help="reshard | gather_broadcast | hybrid: run this one only (default: the site's active transport, from its ledger (promote / rollback) else the profile's refit.transport, and gather_broadcast beside it on the same processes or allocation, for comparison)."),
    iters: int = ITERS, warmup: int = WARMUP, out: Optional[str] = OUT, force: bool = FORCE, checkpoint: Optional[str] = CHECKPOINT,
    full_check: bool = FULL_CHECK, as_json: bool = opt.JSON,
    launcher: Optional[str] = LAUNCHER, slurm_mode: Optional[str] = SLURM_MODE, dry_run: bool = DRY_RUN,
    detach: bool = DETACH, inject: Optional[list[str]] = INJECT,
    retries: int = RETRIES, on_failure: str = ON_FAILURE, timeout_s: Optional[float] = TIMEOUT,
) -> None:
    """Run the refit for real (processes here, or Slurm jobs): every byte verified.

    Without --transport it runs the site's active transport (the ledger's, else the profile's) and also
    gather-and-broadcast on the same processes (or Slurm allocation), to compare."""
    source = flag_record(transport) if transport is not None else _active(request.site)
    t = source["transport"]
    if t not in TRANSPORTS:
        raise InputError(f"--transport {t!r}: expected one of {', '.join(TRANSPORTS)}")
    transports = default_transports(t, explicit=transport is not None,
                                    drills=bool(inject) or retries > 0 or on_failure != "abort")
    run = RunSettings(transports=tuple(transports), iterations=iters, warmup=warmup, timeout_s=timeout_s,
                      retries=retries, on_failure=on_failure, launcher=launcher, slurm_mode=slurm_mode,
                      checkpoint=checkpoint, full_check=full_check, inject=tuple(inject or ()))
    _session(request.replace(run=run), out=out, as_json=as_json, dry_run=dry_run, detach=detach, force=force,
             source=source)


@opt.refit_options(BENCH_HELP_ORDER)
def bench_cmd(
    request: RefitRequest,
    iters: int = ITERS, warmup: int = WARMUP, out: Optional[str] = OUT, force: bool = FORCE, as_json: bool = opt.JSON,
    launcher: Optional[str] = LAUNCHER, slurm_mode: Optional[str] = SLURM_MODE, dry_run: bool = DRY_RUN,
    detach: bool = DETACH,
    transports: Optional[List[str]] = typer.Option(None, "--transport", metavar="NAME",
                                                   help="Only this transport (repeatable; default: all three)."),
) -> None:
    """All three transports on the same processes (or Slurm allocation), side by side, with the raw ceiling.

    Without --transport the summary names the site's active transport (its ledger, else the profile) among
    the three: bench is the evidence promote weighs, so it measures every candidate against gather-and-broadcast
    whatever is active (after a rollback, the run that may promote reshard again)."""
    chosen = list(TRANSPORTS)
    if transports:
        bad = [t for t in transports if t not in TRANSPORTS]
        if bad:
            raise InputError(f"--transport {', '.join(map(repr, bad))}: expected one of {', '.join(TRANSPORTS)}")
        chosen = [t for t in TRANSPORTS if t in transports]  # the usual order, each once
    source = flag_record(chosen[0]) if transports else _active(request.site)
    run = RunSettings(transports=tuple(chosen), iterations=iters, warmup=warmup, baseline=True, launcher=launcher,
                      slurm_mode=slurm_mode)
    _session(request.replace(run=run), out=out, as_json=as_json, dry_run=dry_run, detach=detach, force=force,
             source=source)
