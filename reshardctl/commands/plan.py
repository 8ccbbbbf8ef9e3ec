"""`reshardctl plan`: plan a refit for a site, a model and two layouts; compare the transports.

Everything is validated before any planning (every layout problem listed at once, exit code 2), and
nothing is written unless the whole run succeeds (see reshardctl/plan_files/export.py).
Reference: docs/plan-format.md.
"""

from __future__ import annotations

import re
import shlex
from typing import List, Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.commands.output import escape
from reshardctl.gc_pause import few_collections
from reshardctl.heap_reuse import reused_freed_memory
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.runbook.transport_source import LedgerTransport
from reshardctl.plan_report import plan_report


def _b(n: float) -> str:
    from reshardctl.commands.model import human_bytes

    return human_bytes(int(n))


def _s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} us"


def _pct(e: float) -> str:
    """Efficiency as a percentage that never rounds a positive value to ``0%``: 63%, 4%, 0.4%, 0.04%."""
    pct = 100 * e
    if pct >= 1 or pct <= 0:
        return f"{pct:.0f}%"
    return f"{pct:.1f}%" if pct >= 0.1 else f"{pct:.1g}%"


_BYTES_RE = re.compile(r"\b(\d+) (distinct |model )?bytes\b")


def _human_reason(reason: str) -> str:
    """The lower-bound reason with its raw byte counts humanized (``--json`` keeps the raw numbers):
    'must receive 50974531584 bytes' -> 'must receive 47.5 GiB'."""
    return _BYTES_RE.sub(lambda m: _b(int(m[1])) + (f" of {m[2]}bytes" if m[2] else ""), reason)


# the plan table's columns dropped (in this order) when the terminal is too narrow for all
SECONDARY = ("busiest step: rank, link, bytes", "eff.", "rounds/bkts", "transfers", "staging max")


def render(result: dict, con=None) -> None:
    con = con or output.console()
    inp = result["inputs"]
    topo = inp["topology"]
    con.print(f"[bold]{escape(inp['model'])}[/bold] ({inp['num_tensors']} tensors, {_b(result['bytes_total'])}) "
              f"on site [bold]{escape(inp['site'])}[/bold]", markup=True)
    con.print(f"train {inp['train']}  ({topo['train_world']} ranks, {topo['train_nodes']} node(s))", markup=False)
    con.print(f"infer {inp['infer']}  ({topo['infer_world']} ranks, {topo['infer_nodes']} node(s))", markup=False)
    con.print(f"bucket {_b(inp['bucket_bytes'])}, relay {'on' if inp['relay'] else 'off'} ({inp['relay_reason']})",
              markup=False)
    # the busiest column: the most loaded link of the single busiest step (a p2p round or a bucket's
    # gather / broadcast), not a total over the refit
    cols = ("transport", "on wire", "transfers", "rounds/bkts", "staging max", "predicted", "eff.",
            "busiest step: rank, link, bytes")
    table = output.table(*cols, text=cols[-1:], right=cols[1:-1])
    for name, r in result["transports"].items():
        bz = r["busiest"]
        mark = "*" if name == result["primary_transport"] else ""
        table.add_row(
            escape(name + mark), _b(r["bytes_moved"]), f"{r['transfers']:,}", f"{r['rounds']}/{r['buckets']}",
            _b(r["max_staging_bytes"]), _s(r["predicted_s"]), _pct(r["efficiency"]),
            escape(f"{bz['side']}{bz['side_rank']} {bz['link']} {_b(bz['bytes'])}"),
        )
    output.print_table(table, SECONDARY, con)
    con.print(f"lower bound {_s(result['lower_bound_s'])}: {_human_reason(result['lower_bound_reason'])}", markup=False)
    figs = result.get("cost_figures", "datasheet")
    con.print(f"predicted from {figs} figures" + ("" if figs != "datasheet" else
              f" (no calibration of site {inp['site']}: `reshardctl calibrate --site {inp['site']}` measures it)"),
              markup=False)
    for name, r in result["transports"].items():
        con.print(f"  {name}: " + ", ".join(f"{k} {_s(v)}" for k, v in r["predicted_breakdown_s"].items()), markup=False)
    ld = next(iter(result["transports"].values()))["landing"]  # the inference layout's: the same for every transport
    con.print(f"landing: infer{ld['infer_rank']} writes {ld['params']:,} parameter segments ({_b(ld['bytes'])}) in "
              f"{_s(ld['seconds'])} (one _foreach_copy_); a framework loader ({ld['tensors']:,} per-tensor calls) "
              f"would add {_s(ld['loader_extra_s'])}", markup=False)
    _render_gpu_memory(result["transports"], con)
    for path, fr in result.get("framework_refit", {}).items():
        if "predicted_s" in fr:  # NeMo RL's own refit of these layouts (docs/cost-model.md "The framework's own refit")
            terms = fr["breakdown_s"] if path == "collective" else \
                {**fr["bulk_s"], "misc path": fr["misc"]["predicted_s"]}
            con.print(f"NeMo RL {path} refit: {_s(fr['predicted_s'])} (" + ", ".join(
                f"{k} {_s(v)}" for k, v in terms.items() if v > 0) + ")", markup=False)
    if len(result["transports"]) > 1:
        con.print(f"* = primary transport (fingerprint {result['fingerprint']})", markup=False)
    else:
        con.print(f"fingerprint {result['fingerprint']}", markup=False)
    from reshardctl.plan.m2n_compat import summary_line

    con.print(summary_line(result["m2n_compat"]), markup=False)
    if "compare" in result:
        ccols = ("#", "infer", "layout", "ranks", "predicted", "lower bound", "efficiency", "bytes on wire",
                 "GPU memory")
        ct = output.table(*ccols, text=("infer", "layout"), right=("#", *ccols[3:]),
                          title=f"inference layouts by predicted refit time ({result['compare'][0]['transport']})")
        for r in result["compare"]:
            mem = "-" if r["gpu_memory_bytes"] is None else _b(r["gpu_memory_bytes"]) + (
                " (does not fit)" if r["fits"] is False else "")
            ct.add_row(str(r["rank"]), escape(r["infer"] + (" (current)" if r["current"] else "")), escape(r["layout"]),
                       str(r["infer_world"]), _s(r["predicted_s"]), _s(r["lower_bound_s"]),
                       _pct(r["efficiency"]), _b(r["bytes_moved"]), mem)
        output.print_table(ct, ("lower bound", "efficiency", "GPU memory", "ranks"), con)


def _render_gpu_memory(rows: dict, con) -> None:
    """Per GPU, the busiest inference rank's weights + staged copy + pool + NCCL of each transport, against
    the site's GPU memory where the profile gives it; a transport that does not fit is said (GPU sites)."""
    mem = {t: r["gpu_memory"] for t, r in rows.items() if r.get("gpu_memory")}
    if not mem:
        return
    first = next(iter(mem.values()))
    gpu = first["gpu_bytes"]
    cap = (f"{_b(gpu)} per GPU less {first['reserve']:.0%}" if gpu is not None
           else "no gpu_memory_gib in the site profile: not checked")
    con.print(f"GPU memory, busiest inference rank ({cap}): weights + staged copy (the all-or-nothing commit) "
              f"+ pool + NCCL:", markup=False)
    for t, m in mem.items():
        i, tr = m["inference"], m["trainer"]
        n = i["nccl"]
        verdict = "" if m["fits"] is None else (f", {_b(m['inference_left_bytes'])} left" if m["fits"] else
                                                f": does NOT fit, {_b(-m['inference_left_bytes'])} over")
        if m["max_engine_memory_utilization"] is not None:
            verdict += f" (engine: gpu_memory_utilization <= {m['max_engine_memory_utilization']:.2f})"
        con.print(f"  {t}: infer{i['side_rank']} {_b(i['weights_bytes'])} + {_b(i['staged_copy_bytes'])} + "
                  f"pool {_b(i['pool_bytes'])} + NCCL {_b(n['bytes'])} "
                  f"({n['communicators']} communicator(s), {n['p2p_directions']} p2p directions) = "
                  f"{_b(i['total_bytes'])}{verdict}; train{tr['side_rank']} adds {_b(tr['refit_bytes'])}", markup=False)


# ---------------------------------------------------------------- command --------------------------------
def _warn(text: str) -> None:
    """A site ledger that cannot be used: said on stderr; the plan goes on (with the profile's transport)."""
    output.err_console().print(f"warning: {text}", markup=False, highlight=False)


@opt.refit_options(opt.place(opt.PLAN_FIELDS, "transport", after="mtp"))
def plan_cmd(
    request: RefitRequest,
    transport: str = typer.Option("all", "--transport", help="reshard | gather_broadcast | hybrid | all"),
    as_json: bool = opt.JSON,
    out: Optional[str] = typer.Option(None, "--out", "-o", metavar="DIR",
                                      help="Write plan-<transport>.npz, plan.json and the Slurm scripts into DIR (created with its parents)."),
    export: Optional[str] = typer.Option(None, "--export-transfers", metavar="FILE",
                                         help="Write every transfer as JSON lines to FILE (- for stdout; the report then goes to stderr)."),
    compare_infer: Optional[List[str]] = typer.Option(None, "--compare-infer", help="Candidate inference layout to rank (repeatable)."),
) -> None:
    """Plan a refit: bytes, rounds, staging and predicted seconds per transport, against the lower bound."""
    if as_json and export == "-":
        from reshardctl.errors import OutputError

        raise OutputError("--json and --export-transfers - both write to stdout",
                          hint="give --export-transfers a file name, or leave out --json")
    from reshardctl.commands import progress as live  # rich.progress: not at start (cli.py imports every command)

    # the planner's stages on stderr, once planning has taken longer than a second (deepseek-v3 at 256+256: ~11 s)
    prog = live.LiveProgress(output.err_console, "resolving the model and layouts",
                             enabled=not as_json and not output.quiet(), show_after_s=live.LONG_WORK_S)
    result = None
    try:
        # the plans allocate many small objects (gc_pause.py) and large numpy temporaries (heap_reuse.py)
        with few_collections(), reused_freed_memory():
            inp = prepare(request.replace(transport=transport), out=out, export=export,
                          compare=list(compare_infer or []))
            if transport == "all":  # the primary transport is the site's active one: its ledger, else its profile
                inp.primary = LedgerTransport(request.site, warn=_warn)().transport
            # without --out or --export-transfers nothing reads the plans themselves: planned side by side
            plans, result = plan_report(inp, lambda what, done, total: prog.update(done, total, what),
                                        keep_plans=out is not None or export is not None)
    finally:
        prog.stop(None if result is None else
                  f"planned {len(result['transports'])} transport(s) in {result['planning_s']:.1f} s")
    extra = None
    if out is not None:  # the job scripts next to the plan, ready to submit by hand (docs/slurm.md)
        from pathlib import Path

        from reshardctl.runs.session import session_files

        extra = session_files(inp, plans, Path(out).absolute(), command=shlex.join(output.argv()), launcher="slurm")
    if out is not None or export is not None:  # both outputs or neither (temp names, renamed together)
        from reshardctl.plan_files.export import write_outputs

        paths, n = write_outputs(plans, result, out=out, export=export,
                                 export_plan=plans[result["primary_transport"]] if export is not None else None,
                                 extra=extra)
        for p in paths:
            output.info(f"wrote {escape(str(p))}")
        if out is not None:
            for line in hand_submission(paths, out):
                output.info(escape(line))
        if export is not None:
            where = "stdout" if export == "-" else escape(str(export))
            output.info(f"wrote {n:,} {escape(result['primary_transport'])} transfer lines to {where}")
    if as_json:
        output.print_json(result)
    elif export == "-":  # stdout carries the transfer lines: the report goes to stderr
        render(result, output.err_console())
    else:
        render(result)


__all__ = ["plan_cmd", "render"]


def hand_submission(paths, out: str) -> list[str]:
    """The shell lines that submit `plan --out DIR`'s job scripts by hand and collect the run: a het job,
    or the two jobs (the inference job held until the trainer job has started: ``--dependency=after``).
    umask 077: Slurm creates the jobs' own output files with the submitter's umask."""
    scripts = {p.name: shlex.quote(str(p)) for p in paths if p.suffix == ".sbatch"}
    collect = f"reshardctl collect {shlex.quote(str(out))}"
    if "hetjob.sbatch" in scripts:
        return ["to run it on Slurm by hand:",
                f"  job=$(umask 077 && sbatch --parsable {scripts['hetjob.sbatch']})",
                f'  {collect} --job "$job" --wait']
    return ["to run it on Slurm by hand (two jobs; the inference job starts once the trainer job has started):",
            f"  train=$(umask 077 && sbatch --parsable {scripts['train.sbatch']})",
            f'  infer=$(umask 077 && sbatch --parsable --dependency=after:"$train" {scripts["infer.sbatch"]})',
            f'  {collect} --job "$train,$infer" --wait']

