"""`reshardctl model show|list`: the model catalog (docs/models.md)."""

from __future__ import annotations

import fnmatch
from dataclasses import asdict
from typing import Optional

import typer
from rich.markup import escape

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError
from reshardctl.models.catalog import PRESETS, load_model
from reshardctl.models.spec import ROLES, ModelSpec

app = typer.Typer(help="Model catalog: tensor inventories of presets and checkpoints.", cls=output.HelpGroup)


def human_bytes(n: int) -> str:
    """Binary units: 221267968 -> '211.0 MiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError  # pragma: no cover


def human_count(n: int) -> str:
    """Decimal units: 8030261248 -> '8.03B'."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def role_totals(model: ModelSpec) -> dict[str, dict[str, int]]:
    """{role: {tensors, params, bytes}} in ROLES order, roles present only."""
    totals = {r: {"tensors": 0, "params": 0, "bytes": 0} for r in ROLES}
    for t in model.tensors:
        row = totals.setdefault(t.role, {"tensors": 0, "params": 0, "bytes": 0})
        row["tensors"] += 1
        row["params"] += t.numel
        row["bytes"] += t.nbytes
    return {r: v for r, v in totals.items() if v["tensors"]}


def summary(model: ModelSpec) -> dict:
    """What `model show --json` prints."""
    return {
        "name": model.name,
        "source": model.source,
        "arch": model.dims.arch,
        "num_tensors": len(model.tensors),
        "num_params": model.num_params,
        "num_bytes": model.num_bytes,
        "roles": role_totals(model),
        "dims": asdict(model.dims),
    }


def _layers_line(model: ModelSpec) -> str:
    d = model.dims
    parts = [f"{d.num_layers} decoder layers"]
    main_moe = [l for l in d.moe_layers if l < d.num_layers]
    if main_moe:
        parts.append(f"{len(main_moe)} MoE ({d.num_experts} experts"
                     + (f" + {d.num_shared_experts} shared" if d.num_shared_experts and d.arch != "qwen2_moe" else "")
                     # Qwen2-MoE: one shared expert, its width held as num_shared_experts x moe_intermediate
                     + (f" + 1 shared of width {d.num_shared_experts * d.moe_intermediate}"
                        if d.num_shared_experts and d.arch == "qwen2_moe" else "") + ")")
    if d.num_mtp_layers:
        parts.append(f"+ {d.num_mtp_layers} MTP")
    return ", ".join(parts)


@app.command("show")
def show(
    model: str = typer.Argument(..., help=f"Preset ({', '.join(PRESETS)}), directory, config.json or index.json."),
    layers: Optional[int] = opt.LAYERS,
    as_json: bool = opt.JSON,
    mtp: bool = typer.Option(False, "--mtp", help="Include DeepSeek MTP layers."),
    scales: bool = typer.Option(False, "--scales", help="Checkpoint view of fp8 models: fp8 weights + weight_scale_inv."),
    tensors: bool = typer.Option(False, "--tensors", help="List every tensor: name, shape, dtype, role."),
    filter_: Optional[str] = typer.Option(None, "--filter", metavar="GLOB",
                                          help="With --tensors: only names matching this glob, e.g. '*q_proj*'."),
) -> None:
    """Print a model's tensor inventory: counts, parameters, bytes, per-role totals (--tensors: every name)."""
    if filter_ is not None and not tensors:
        raise InputError("--filter selects tensor names: give it with --tensors")
    m = load_model(model, layers=layers, include_mtp=mtp, include_scales=scales)
    if tensors:
        rows = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "role": t.role}
                for t in m.tensors if filter_ is None or fnmatch.fnmatchcase(t.name, filter_)]
        if filter_ is not None and not rows:
            raise InputError(f"--filter {filter_!r}: no tensor of model {m.name} matches",
                             hint=f"e.g. {m.tensors[0].name!r}, or a glob like '*q_proj*'")
        if as_json:
            output.print_json(rows)
            return
        table = output.table("tensor", "shape", "dtype", "role", text=("tensor",))
        for r in rows:
            table.add_row(escape(r["name"]), str(r["shape"]), r["dtype"], r["role"])
        output.print_table(table, ("dtype", "role"))
        return
    if as_json:
        output.print_json(summary(m))
        return
    con = output.console()
    arch_class = (m.config.get("architectures") or [m.dims.arch])[0]
    con.print(f"[bold]{m.name}[/bold]  [dim]{m.source}[/dim]", markup=True)
    con.print(f"architecture  {arch_class} ({m.dims.arch}), {_layers_line(m)}", markup=False)
    dtypes = sorted({t.dtype for t in m.tensors})
    con.print(f"tensors       {len(m.tensors):,}  (dtypes: {', '.join(dtypes)})", markup=False)
    con.print(f"parameters    {human_count(m.num_params)}  ({m.num_params:,})", markup=False)
    con.print(f"bytes         {human_bytes(m.num_bytes)}  ({m.num_bytes:,})", markup=False)
    table = output.table("role", "tensors", "params", "bytes", "", text=("role",), right=("tensors", "params", "bytes", ""))
    for role, v in role_totals(m).items():
        table.add_row(role, f"{v['tensors']:,}", f"{v['params']:,}", f"{v['bytes']:,}", human_bytes(v["bytes"]))
    output.print_table(table, ("bytes",), con)


@app.command("list")
def list_presets(as_json: bool = opt.JSON) -> None:
    """List the shipped presets with their sizes (training view: no MTP, model dtype)."""
    rows = [summary(load_model(p)) for p in PRESETS]
    if as_json:
        output.print_json([{k: v for k, v in r.items() if k != "roles"} for r in rows])
        return
    table = output.table("preset", "arch", "layers", "tensors", "params", "bytes",
                         right=("layers", "tensors", "params", "bytes"))
    for r in rows:
        table.add_row(
            r["name"], r["arch"], str(r["dims"]["num_layers"]), f"{r['num_tensors']:,}",
            human_count(r["num_params"]), human_bytes(r["num_bytes"]),
        )
    output.print_table(table, ("arch", "tensors"))
