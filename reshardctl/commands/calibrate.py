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

LABELS = {
    "intra_node_bytes_per_s": ("p2p inside a node", "bw"), "intra_node_latency_s": ("latency inside a node", "s"),
    "cross_node_bytes_per_s": ("p2p across nodes", "bw"), "cross_node_latency_s": ("latency across nodes", "s"),
    "node_aggregate_bytes_per_s": ("all pairs at once", "bw"), "launch_s": ("grouped operation launch", "s"),
    "per_message_s": ("per message in a group", "s"), "broadcast_bytes_per_s": ("broadcast (delivered)", "bw"),
    "copy_bytes_per_s": ("pack/unpack copy, one rank", "bw"), "checksum_bytes_per_s": ("checksum, one rank", "bw"),
    "copy_side_bytes_per_s": ("copy, one node's ranks at once", "bw"),
    "checksum_side_bytes_per_s": ("checksum, one node's ranks at once", "bw"),
}


def figure_text(key: str, value: float) -> str:
    kind = LABELS[key][1]
    if kind == "bw":
        return f"{value / 1e9:.2f} GB/s"
    return f"{value * 1e6:.1f} us" if value < 1e-2 else f"{value * 1e3:.1f} ms"


def figures_table(figs: dict) -> Table:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("measured")
    t.add_column("figure", justify="right")
    for k, v in figs.items():
        t.add_row(LABELS[k][0], figure_text(k, v))
    return t


def calibrate_cmd(
    site: str = opt.SITE,
    out: Optional[str] = typer.Option(None, "--out", help="Write the calibration to FILE (default: the per-user state directory)."),
    reps: int = typer.Option(5, "--reps", min=1, help="Timed repetitions per microbenchmark (the median is kept)."),
    as_json: bool = opt.JSON,
) -> None:
    """Run microbenchmarks on the site's ranks and write a calibration file for its predictions."""
    from reshardctl.atomic_write import write_json_atomic
    from reshardctl.calibrate.runner import calibration, measure
    from reshardctl.errors import InputError
    from reshardctl.site import load_profile
    from reshardctl.site.measured import default_path

    prof = load_profile(site)
    path = Path(out) if out is not None else default_path(prof.name)
    if path.is_dir():
        raise InputError(f"--out {path}: is a directory")
    if out is not None and not path.parent.is_dir():
        raise InputError(f"--out {path}: directory {path.parent} does not exist")
    if not as_json and not output.quiet():
        output.info(f"calibrating site {prof.name}: microbenchmarks on {2 * min(prof.gpus_per_node, 4)} local ranks")
    data = calibration(prof, measure(prof, reps=reps))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, indent=2)
    if as_json:
        output.print_json({**data, "path": str(path)})
        return
    output.console().print(figures_table(data["figures"]))
    output.console().print(f"wrote {path}", markup=False, highlight=False)


__all__ = ["calibrate_cmd", "figures_table", "figure_text"]
