"""`reshardctl run` (one transport, for real) and `reshardctl bench` (all three side by side).

Both run every rank as a process on this machine (gloo on CPU, NCCL where each rank has a GPU),
verify every byte, and leave a run directory (see reshardctl/runs/rundir.py).
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.plan.inputs import prepare
from reshardctl.plan.model import TRANSPORTS
from reshardctl.runs.session import run_session

ITERS = typer.Option(5, "--iters", min=1, help="Timed refits per transport.")
WARMUP = typer.Option(1, "--warmup", min=0, help="Untimed refits first (connections, buffers).")
OUT = typer.Option(None, "--out", help="Run directory (default runs/<UTC time>-<label>).")
CHECKPOINT = typer.Option(None, "--checkpoint", help="safetensors checkpoint (file or dir): trainer ranks read their slices from it.")
FULL_CHECK = typer.Option(False, "--full-check", help="Also compare every destination box with the weight source (timed apart).")


def _s(x) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def _b(n) -> str:
    from reshardctl.commands.model import human_bytes

    return human_bytes(int(n))


def _session(transports, *, site, model, layers, train, infer, train_style, infer_style, train_layout,
             infer_layout, bucket_mb, relay, iters, warmup, baseline, out, checkpoint, full_check, as_json):
    inp = prepare(site=site, model=model, layers=layers, train=train, infer=infer, train_style=train_style,
                  infer_style=infer_style, train_layout=train_layout, infer_layout=infer_layout,
                  transport=transports[0] if len(transports) == 1 else "all", bucket_mb=bucket_mb, relay=relay)
    if not as_json and not output.quiet():
        output.info(f"{inp.model.name}: train {inp.train.describe()} -> infer {inp.infer.describe()} "
                    f"({inp.topology.world} processes), transports {', '.join(transports)}")
        if not inp.site.cpu_only:
            output.info(f"note: site {inp.site.name} describes GPUs; here every rank is a process on this machine "
                        f"(NCCL only where each rank has its own GPU, else gloo on CPU), so the measured times are "
                        f"this machine's, not the site's; `reshardctl plan` predicts the site")
    show = not as_json and not output.quiet()
    with Progress(TextColumn("refits"), BarColumn(), TextColumn("{task.completed}/{task.total} rank commits"),
                  TimeElapsedColumn(), console=output.err_console(), disable=not show, transient=True) as prog:
        task = prog.add_task("refit", total=None)
        res = run_session(inp, list(transports), iterations=iters, warmup=warmup, baseline=baseline, out=out,
                          checkpoint=checkpoint, full_check=full_check, argv=output.argv(),
                          progress=lambda done, total: prog.update(task, completed=done, total=total))
    if as_json:
        output.print_json(res.summary)
    else:
        render(res.summary)
    if res.error is not None:
        raise res.error
    return res


def render(summary: dict) -> None:
    con = output.console()
    trs = summary["transports"]
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    cols = ["transport", "refit median", "p90", "transfer", "verify", "GB/s", "vs reshard", "raw ceiling",
            "of ceiling", "predicted", "measured/pred.", "peak staging", "verified"]
    for c in cols:
        table.add_column(c, justify="left" if c == "transport" else "right", no_wrap=True)
    sp = summary.get("speedup_vs_reshard", {})
    for name, s in trs.items():
        raw = s.get("raw_baseline_s")
        ratio = s.get("transfer_vs_raw")
        table.add_row(
            escape(name), _s(s["refit_s"]["median"]), _s(s["refit_s"]["p90"]), _s(s["transfer_s"]["median"]),
            _s(s["verify_s"]["median"]), f"{s['effective_gbps']:.2f}",
            f"{sp[name]:.2f}x" if name in sp else "-", _s(raw), f"{100 * ratio:.0f}%" if ratio else "-",
            _s(s["predicted_s"]),
            f"{s['measured_vs_predicted']:.2f}" if s.get("measured_vs_predicted") else "-",
            _b(s["peak_staging_bytes"]), "yes" if s["verified"] else "NO",
        )
    con.print(table)
    con.print(f"predicted from {summary.get('cost_figures', 'datasheet')} figures"
              + ("" if "calibration" in summary.get("cost_figures", "") else
                 " (no calibration: run `reshardctl calibrate` for this site's own figures)"), markup=False, highlight=False)
    for name, s in trs.items():
        br = s.get("predicted_breakdown_s") or {}
        if br:
            con.print(f"  {name} predicted: " + ", ".join(f"{k} {_s(v)}" for k, v in br.items()), markup=False,
                      highlight=False)
    con.print(f"run directory: {summary['run_dir']}", markup=False, highlight=False)
    for name, s in trs.items():
        for f in s["failures"][:5]:
            con.print(f"{name}: rank {f['rank']} ({f['side']} {f['side_rank']}): {f['error']}: {f['message']}",
                      markup=False)


def run_cmd(
    site: str = opt.SITE, model: str = opt.MODEL, layers: Optional[int] = opt.LAYERS,
    train: Optional[str] = opt.TRAIN, infer: Optional[str] = opt.INFER,
    train_style: str = opt.TRAIN_STYLE, infer_style: str = opt.INFER_STYLE,
    train_layout: Optional[str] = opt.TRAIN_LAYOUT, infer_layout: Optional[str] = opt.INFER_LAYOUT,
    transport: Optional[str] = typer.Option(None, "--transport", help="reshard | gather_broadcast | hybrid (default: the profile's refit.transport)."),
    bucket_mb: Optional[float] = opt.BUCKET_MB, relay: str = opt.RELAY,
    iters: int = ITERS, warmup: int = WARMUP, out: Optional[str] = OUT, checkpoint: Optional[str] = CHECKPOINT,
    full_check: bool = FULL_CHECK, as_json: bool = opt.JSON,
) -> None:
    """Run the refit for real on this machine: every rank a process, every byte verified."""
    from reshardctl.errors import InputError
    from reshardctl.site import load_profile

    t = transport or load_profile(site).refit.transport
    if t not in TRANSPORTS:
        raise InputError(f"--transport {t!r}: expected one of {', '.join(TRANSPORTS)}")
    _session([t], site=site, model=model, layers=layers, train=train, infer=infer, train_style=train_style,
             infer_style=infer_style, train_layout=train_layout, infer_layout=infer_layout, bucket_mb=bucket_mb,
             relay=relay, iters=iters, warmup=warmup, baseline=False, out=out, checkpoint=checkpoint,
             full_check=full_check, as_json=as_json)


def bench_cmd(
    site: str = opt.SITE, model: str = opt.MODEL, layers: Optional[int] = opt.LAYERS,
    train: Optional[str] = opt.TRAIN, infer: Optional[str] = opt.INFER,
    train_style: str = opt.TRAIN_STYLE, infer_style: str = opt.INFER_STYLE,
    train_layout: Optional[str] = opt.TRAIN_LAYOUT, infer_layout: Optional[str] = opt.INFER_LAYOUT,
    bucket_mb: Optional[float] = opt.BUCKET_MB, relay: str = opt.RELAY,
    iters: int = ITERS, warmup: int = WARMUP, out: Optional[str] = OUT, as_json: bool = opt.JSON,
) -> None:
    """All three transports on the same processes, side by side, with the raw-transfer ceiling."""
    _session(list(TRANSPORTS), site=site, model=model, layers=layers, train=train, infer=infer,
             train_style=train_style, infer_style=infer_style, train_layout=train_layout,
             infer_layout=infer_layout, bucket_mb=bucket_mb, relay=relay, iters=iters, warmup=warmup,
             baseline=True, out=out, checkpoint=None, full_check=False, as_json=as_json)
