"""`reshardctl calibrate --site S`: measure the site's links, copies and checksums; write a calibration file.

The file goes to ``$XDG_STATE_HOME/reshardctl/<site>.calibration.json`` (where `plan`, `run` and `bench`
find it by site name) or to ``--out FILE`` (name it in the profile as ``measured: FILE`` to share it).
Written atomically: a failed calibration leaves any earlier file as it was. docs/cost-model.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.request.request import RefitRequest

LABELS = {
    "intra_node_bytes_per_s": ("p2p inside a node", "bw"), "intra_node_latency_s": ("latency inside a node", "s"),
    "cross_node_bytes_per_s": ("p2p across nodes", "bw"), "cross_node_latency_s": ("latency across nodes", "s"),
    "node_aggregate_bytes_per_s": ("all pairs at once", "bw"), "launch_s": ("grouped operation launch", "s"),
    "per_message_s": ("per message in a group", "s"), "broadcast_bytes_per_s": ("broadcast (delivered)", "bw"),
    "copy_bytes_per_s": ("pack/unpack copy, one rank", "bw"), "checksum_bytes_per_s": ("checksum, one rank", "bw"),
    "copy_side_bytes_per_s": ("copy, one node's ranks at once", "bw"),
    "checksum_side_bytes_per_s": ("checksum, one node's ranks at once", "bw"),
    "checksum_world_bytes_per_s": ("checksum, every rank at once", "bw"),
    "control_round_s": ("control round, every rank", "s"),
    "landing_s_per_param": ("landing, per parameter segment", "s"),
    "loader_s_per_tensor": ("framework loader, per tensor", "s"),
    "mapping_s_per_entry": ("load_weights name mapping, per entry", "s"),
    "named_params_s_per_param": ("load_weights parameter table, per parameter", "s"),
}


def figure_text(key: str, value: float) -> str:
    kind = LABELS[key][1]
    if kind == "bw":
        return f"{value / 1e9:.2f} GB/s"
    if value < 1e-6:
        return f"{value * 1e9:.0f} ns"
    return f"{value * 1e6:.1f} us" if value < 1e-2 else f"{value * 1e3:.1f} ms"


def figures_table(figs: dict) -> Table:
    t = output.table("measured", "figure", text=("measured",), right=("figure",))
    for k, v in figs.items():
        t.add_row(LABELS[k][0], figure_text(k, v))
    return t


@opt.refit_options(("site",))
def calibrate_cmd(
    request: RefitRequest,
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="Write the calibration to FILE (default: the per-user state directory)."),
    reps: int = typer.Option(5, "--reps", min=1, metavar="N", help="Timed repetitions per microbenchmark (the median is kept)."),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME", help="local | slurm (default: the profile's launcher). Slurm measures two of the site's own nodes."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", metavar="DIR", help="Slurm: the job's directory, seen by every node (default runs/<UTC time>-calibrate)."),
    as_json: bool = opt.JSON,
) -> None:
    """Run microbenchmarks on the site's ranks and write a calibration file for its predictions."""
    from reshardctl.atomic_write import write_json_atomic
    from reshardctl.calibrate.runner import calibration, measure
    from reshardctl.commands.progress import LiveProgress  # not at module level: rich.progress, 10-20 ms at start
    from reshardctl.atomic_write import output_problem
    from reshardctl.errors import InputError
    from reshardctl.site import load_profile
    from reshardctl.site.measured import default_path

    prof = load_profile(request.site)
    launcher = launcher or prof.launcher
    if launcher not in ("local", "slurm"):
        raise InputError(f"--launcher {launcher!r}: expected local or slurm")
    if run_dir is not None and launcher != "slurm":
        raise InputError("--run-dir is for the Slurm launcher (--launcher slurm)")
    path = Path(out) if out is not None else default_path(prof.name)
    why = output_problem(path)  # only regular files are written (a device is never replaced)
    if why:
        raise InputError(f"--out {path}: {why}")
    if out is not None and not path.parent.is_dir():
        raise InputError(f"--out {path}: directory {path.parent} does not exist")
    if launcher == "slurm":
        raw = _measure_on_slurm(prof, reps, run_dir, quiet=as_json or output.quiet())
    else:
        show = not as_json and not output.quiet()
        if show:
            output.info(f"calibrating site {prof.name}: microbenchmarks on {2 * min(prof.gpus_per_node, 4)} local ranks")
        prog = LiveProgress(output.err_console(), "microbenchmarks running", enabled=show)
        prog.start()
        raw = None
        try:
            raw = measure(prof, reps=reps)
        finally:
            prog.stop(None if raw is None else "microbenchmarks done")
    data = calibration(prof, raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, indent=2)
    if as_json:
        output.print_json({**data, "path": str(path)})
        return
    output.console().print(figures_table(data["figures"]))
    output.console().print(checksum_line(data), markup=False, highlight=False)
    output.console().print(f"wrote {path}", markup=False, highlight=False)


def checksum_line(data: dict) -> str:
    """Which checksum path the ranks took and its rate beside the copy's (one rank each)."""
    f = data["figures"]
    ck, cp = f["checksum_bytes_per_s"], f["copy_bytes_per_s"]
    path = data.get("versions", {}).get("checksum_path", "?")
    return (f"checksum path {path}: {ck / 1e9:.2f} GB/s on one rank, {ck / cp:.2f}x the pack/unpack copy "
            f"({cp / 1e9:.2f} GB/s); chosen by measurement on the ranks' machine (`reshardctl selftest` shows every path)")


def _measure_on_slurm(prof, reps: int, run_dir: str | None, *, quiet: bool) -> dict:
    from reshardctl.runs.rundir import new_run_dir, private_umask

    with private_umask():  # the run directory, the job's files and the ranks' results: the user's alone
        return _measure_in(prof, reps, new_run_dir(run_dir, "calibrate").resolve(), quiet=quiet)


def _measure_in(prof, reps: int, d, *, quiet: bool) -> dict:
    import sys

    from reshardctl.calibrate.runner import measure_slurm
    from reshardctl.commands.progress import LiveProgress, end_line

    if not quiet:
        output.info(f"calibrating site {prof.name} on Slurm: two nodes x {prof.gpus_per_node} ranks; job files in {d}")
    prog = LiveProgress(output.err_console(), "submitting", enabled=not quiet)
    prog.start()
    raw = None
    try:
        raw, _ = measure_slurm(prof, d, python=sys.executable, reps=reps, on_state=prog.state)
    finally:
        prog.stop(None if raw is None else end_line((raw.get("slurm") or {}).get("states") or {}))
    return raw


__all__ = ["calibrate_cmd", "figures_table", "figure_text"]
