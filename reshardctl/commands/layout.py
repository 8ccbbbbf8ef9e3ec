"""`reshardctl layout show`: who holds what, per tensor (rank -> boxes) or per rank (local params)."""

from __future__ import annotations

import fnmatch
import shlex
from typing import Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError, LayoutError, OutputError
from reshardctl.layout.megatron import MegatronLayout
from reshardctl.request.request import RefitRequest

app = typer.Typer(help="Trainer / inference layouts: which rank holds which part of every tensor.",
                  cls=output.HelpGroup)


def fmt_box(box) -> str:
    """``[0:512, 0:1024]`` (numpy slice notation, half-open)."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _load_model(request: RefitRequest):
    from reshardctl.models import load_model

    if request.mtp and request.layers is not None:
        raise InputError(f"--mtp with --layers {request.layers}: the MTP layers follow the last decoder layer; "
                         f"give one or the other")
    return load_model(request.model, layers=request.layers, include_mtp=request.mtp)


def _side_args(request: RefitRequest) -> dict[str, tuple]:
    """Per side: (parallel string, style, layout file) of ``request``."""
    r = request
    return {"train": (r.train, r.train_style, r.train_layout), "infer": (r.infer, r.infer_style, r.infer_layout)}


def _tensor_rows(layout, pattern: str | None) -> list[dict]:
    rows = []
    for i, t in enumerate(layout.model.tensors):
        if pattern and not fnmatch.fnmatchcase(t.name, pattern):
            continue
        pl = layout.placement(i)
        groups: dict[tuple, list[int]] = {}
        for r, h in pl.items():
            if h:
                groups.setdefault(h, []).append(r)
        rows.append({
            "tensor": t.name, "shape": list(t.shape), "dtype": t.dtype, "stage": layout.stage_of(i),
            "holders": [{"ranks": sorted(set(rs)), "boxes": [[list(iv) for iv in b] for b in h]}
                        for h, rs in groups.items()],
        })
    return rows


def _rank_params(layout, rank: int, pattern: str | None, megatron_spec: str) -> list[dict]:
    if not 0 <= rank < layout.world_size:
        raise LayoutError(f"--rank {rank} is outside {layout.side} world size {layout.world_size}")
    out = []
    params = (layout.local_params(rank, spec=megatron_spec) if isinstance(layout, MegatronLayout)
              else layout.local_params(rank))
    for p in params:
        segs = [s for s in p.segments if not pattern or fnmatch.fnmatchcase(s.hf_name, pattern)]
        if pattern and not segs:
            continue
        out.append({"param": p.name, "shape": list(p.shape), "dtype": p.dtype, "buffer": p.buffer,
                    "segments": [{"tensor": s.hf_name, "box": [list(iv) for iv in s.box], "offset": list(s.offset)}
                                 for s in segs]})
    return out


def _ranks_str(rs: list[int]) -> str:
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"{rs[0]}-{rs[-1]}"
    return ",".join(map(str, rs))


@app.command("show")
@opt.refit_options(opt.LAYOUT_FIELDS)
def show(
    request: RefitRequest,
    side: str = typer.Option("both", "--side", metavar="SIDE", help="train | infer | both"),
    rank: Optional[int] = typer.Option(None, "--rank", metavar="N",
                                       help="Show this rank's local (framework) parameters with segments."),
    tensor: Optional[str] = typer.Option(None, "--tensor", metavar="GLOB", help="Only HF tensors matching this glob."),
    megatron_spec: str = typer.Option("te", "--megatron-spec", metavar="SPEC",
                                      help="With --rank on a Megatron side: te (Transformer Engine names) | local "
                                           "(megatron-core local spec names)."),
    as_json: bool = opt.JSON,
    site: Optional[str] = typer.Option(None, "--site", metavar="NAME|FILE", help="Site profile: check the allocation as `plan` does (the nodes "
                             "both sides need must fit in the site's nodes; builds both sides)."),
) -> None:
    """Print, per HF tensor, which ranks hold which boxes (or, with --rank, that rank's parameters)."""
    from reshardctl.request.resolve import layout_or_problems, topology_or_problems

    if side not in ("train", "infer", "both"):
        raise InputError(f"--side {side!r}: expected train, infer or both")
    if tensor is not None and not tensor.strip():
        raise InputError("--tensor '': empty; give a glob such as '*q_proj*', or leave --tensor out for every tensor")
    m = _load_model(request)
    prof = None
    if site:
        from reshardctl.site import load_profile

        prof = load_profile(site)
    # the allocation rule involves both sides, so with --site both are built (and checked) as in `plan`
    sides = ["train", "infer"] if side == "both" or prof is not None else [side]
    args = _side_args(request)
    layouts, worlds, problems = {}, {}, []
    for s in sides:
        spec, style, lf = args[s]
        layouts[s], worlds[s] = layout_or_problems(m, s, spec, style, lf, problems, f"--{s}")
    if prof is not None:
        topology_or_problems(prof, worlds["train"], worlds["infer"], problems, "allocation")
    if problems:  # every problem of both sides and the allocation together, as `plan` reports them
        raise LayoutError(problems)
    if side != "both":
        layouts = {side: layouts[side]}
    if tensor:
        first = next(iter(layouts.values()))
        if not any(fnmatch.fnmatchcase(t.name, tensor) for t in first.model.tensors):
            raise InputError(f"--tensor {tensor!r}: no tensor of model {m.name} matches",
                             hint=f"e.g. {m.tensors[0].name!r}, or a glob like '*q_proj*' (`reshardctl model show "
                                  f"{shlex.quote(request.model)} --tensors --filter GLOB` lists the names)")
    result = {"model": m.name, "tensors": len(m.tensors), "sides": {}}
    for s, lay in layouts.items():
        rules = getattr(lay, "framework_rules", None)
        entry = {"layout": lay.describe(), "rules": rules() if rules else "generic per-tensor placements "
                 "(DTensor semantics of torch 2.13)", "world_size": lay.world_size, "stages": [
            list(lay.stage_ranks(p)) for p in range(lay.num_stages())]}
        if rank is not None:
            entry["rank"] = rank
            entry["params"] = _rank_params(lay, rank, tensor, megatron_spec)
        else:
            entry["tensors"] = _tensor_rows(lay, tensor)
        result["sides"][s] = entry
    if as_json:
        output.print_json(result)
        return
    con = output.console()
    con.print(f"[bold]{m.name}[/bold]: {len(m.tensors)} tensors")
    for s, entry in result["sides"].items():
        con.print(f"\n[bold]{s}[/bold]: {entry['layout']}  ({entry['world_size']} ranks, "
                  f"{len(entry['stages'])} stage{'s' if len(entry['stages']) != 1 else ''})")
        con.print(f"  models: {entry['rules']}", markup=False)
        if rank is not None:
            for p in entry["params"]:
                con.print(f"  {p['param']}  {p['shape']} {p['dtype']}" + ("  (buffer)" if p["buffer"] else ""))
                for sg in p["segments"]:
                    con.print(f"      {fmt_box(sg['box'])} of {sg['tensor']}  at offset {sg['offset']}")
            continue
        for row in entry["tensors"]:
            con.print(f"  {row['tensor']}  {row['shape']} (stage {row['stage']})")
            for h in row["holders"]:
                boxes = " + ".join(fmt_box(b) for b in h["boxes"])
                con.print(f"      rank {_ranks_str(h['ranks'])}: {boxes}")


@app.command("export")
@opt.refit_options(opt.place(opt.LAYOUT_FIELDS, "side", after="layers"))
def export(
    request: RefitRequest,
    side: str = typer.Option(..., "--side", metavar="SIDE", help="train | infer: which side's layout to write."),
    site: Optional[str] = typer.Option(None, "--site", metavar="NAME|FILE", help="Site profile: check the allocation "
                                       "as `plan` does (the nodes both sides need must fit in the site's nodes; "
                                       "builds both sides) before writing."),
    out: str = typer.Option(..., "--out", "-o", metavar="FILE",
                            help="Layout file to write: FILE.json (JSON), FILE.yaml or FILE.yml (YAML)."),
) -> None:
    """Write one side's layout as an explicit generic layout file (per tensor: boxes per rank).

    Load it back with --train-layout / --infer-layout: it plans exactly like the parallel string.
    """
    from pathlib import Path

    from reshardctl.atomic_write import output_problem
    from reshardctl.layout.layout_file import export_layout_file
    from reshardctl.request.resolve import layout_file_problems, layout_or_problems, topology_or_problems

    problems: list[str] = []
    if side not in ("train", "infer"):
        problems.append(f"--side {side!r}: expected train or infer")
    if Path(out).suffix not in (".yaml", ".yml", ".json"):
        problems.append(f"--out {out}: expected a .yaml, .yml or .json file name")
    elif output_problem(out):  # a directory, a device, a FIFO (or a link to one): never replaced
        problems.append(f"--out {out}: {output_problem(out)}")
    else:
        for parent in Path(out).absolute().parents:  # the nearest existing one must be a directory
            if parent.exists():
                if not parent.is_dir():
                    problems.append(f"--out {out}: {parent} is a file, not a directory")
                break
    for lf, flag in ((request.train_layout, "--train-layout"), (request.infer_layout, "--infer-layout")):
        if lf is not None:
            problems.extend(layout_file_problems(lf, flag))
    if problems:  # flag problems first, every one at once (as `plan` reports them)
        raise InputError(problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n"
                         + "\n".join(f"  - {p}" for p in problems))
    from reshardctl.commands import progress as live  # rich.progress: not at start (cli.py imports every command)

    # the stages on stderr once the export has taken longer than a second (deepseek-v3, 256 vLLM ranks: ~4 s)
    prog = live.LiveProgress(output.err_console(), "loading the model", enabled=not output.quiet(),
                             show_after_s=live.LONG_WORK_S)
    # as in `layout show`: the allocation rule involves both sides, so with --site both are built
    sides = ["train", "infer"] if site else [side]
    total = len(sides) + 3
    path = None
    try:
        m = _load_model(request)
        prof = None
        if site:
            from reshardctl.site import load_profile

            prof = load_profile(site)
        args = _side_args(request)
        layouts, worlds = {}, {}
        for k, s in enumerate(sides, 1):
            prog.update(k, total, f"building the {s} layout")
            spec, style, lf = args[s]
            layouts[s], worlds[s] = layout_or_problems(m, s, spec, style, lf, problems, f"--{s}")
        if prof is not None:
            topology_or_problems(prof, worlds["train"], worlds["infer"], problems, "allocation")
        if problems:
            raise LayoutError(problems)
        lay = layouts[side]
        prog.update(total - 2, total, "listing every rank's boxes")
        try:  # missing parent directories are created, as for `plan --out` / `--export-transfers`
            Path(out).absolute().parent.mkdir(parents=True, exist_ok=True)
            path = export_layout_file(lay, out, on_write=lambda: prog.update(total - 1, total, f"writing {out}"))
        except OSError as e:
            raise OutputError(f"--out {out}: cannot write: {e.strerror or e}",
                              hint="choose a path in a writable directory") from None
    finally:
        prog.stop()  # the "wrote" line below says how it ended
    output.info(f"wrote {side} layout {lay.describe()} ({lay.world_size} ranks, {len(m.tensors)} tensors) to {path}")
