"""`reshardctl profile show|validate|list`: site profiles (docs/site-profiles.md)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.text import Text
from rich.tree import Tree

from reshardctl.commands import output
from reshardctl.errors import ProfileError
from reshardctl.site.default_site import choose_site
from reshardctl.site import (
    DEFAULT_PROFILE,
    SiteProfile,
    available_profiles,
    load_profile,
    load_profile_file,
    profile_to_dict,
)

app = typer.Typer(help="Site profiles: show the resolved profile, validate files, list shipped profiles.",
                  cls=output.HelpGroup)


def _report(exc: ProfileError) -> None:
    """Like ``output.error`` but never reads the message as rich markup: profile messages quote
    hostlists and flags ("gpu[001-032]", "[x]") that markup would swallow."""
    output.err_console().print(Text.assemble(("error:", "bold red"), " ", str(exc)))


def _gb(x: float) -> str:
    return f"{x / 1e9:g} GB/s"


def derived(p: SiteProfile) -> dict:
    """Numbers computed from the profile (shown by `profile show`, also in its --json)."""
    return {
        "num_nodes": p.num_nodes,
        "total_gpus": p.total_gpus,
        "gpus_per_domain": p.gpus_per_domain,
        "num_domains": p.num_domains,
        "nvlink_bytes_per_s": p.links.nvlink_bytes_per_s,
        "nic_bytes_per_s": p.links.nic_bytes_per_s,
        "node_nic_bytes_per_s": p.links.node_nic_bytes_per_s,
        "bucket_bytes": p.refit.bucket_bytes,
    }


def _short_nodes(nodes: tuple[str, ...]) -> str:
    if len(nodes) <= 6:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:3])}, ..., {', '.join(nodes[-2:])}"


def _render(p: SiteProfile) -> None:
    d = profile_to_dict(p)
    tree = Tree(f"[bold]{p.name}[/bold]  [dim]{p.source}[/dim]")
    top = tree.add("[bold]nodes[/bold]")
    top.add(f"{p.num_nodes} nodes: {_short_nodes(p.nodes)}")
    kind = "ranks (CPU processes, gloo)" if p.cpu_only else "GPUs"
    mem = "" if p.cpu_only else (f", {p.gpu_memory_gib:g} GiB each" if p.gpu_memory_gib is not None
                                 else " (no gpu_memory_gib: plan checks no GPU's memory)")
    top.add(f"{p.gpus_per_node} {kind} per node, {p.total_gpus} in all{mem}")
    unit = "ranks" if p.cpu_only else "GPUs"
    top.add(f"NVLink domain: {p.nvlink_domain_nodes} node(s) = {p.gpus_per_domain} {unit}; {p.num_domains} domain(s)")

    links = output.table("link", "bandwidth (per direction)", "latency", text=("link",),
                         right=("bandwidth (per direction)", "latency"))
    # on a cpu_only site the "NVLink" figures describe the ranks' shared-memory / loopback path within a node
    fast = "intra-node loopback (per rank)" if p.cpu_only else "NVLink (per GPU)"
    links.add_row(fast, f"{p.links.nvlink_gbytes_per_s:g} GB/s", f"{p.links.nvlink_latency_us:g} us")
    links.add_row("NIC (each)", f"{p.links.nic_gbits_per_s:g} Gbit/s = {_gb(p.links.nic_bytes_per_s)}",
                  f"{p.links.nic_latency_us:g} us")
    links.add_row(f"NICs per node (x{p.links.nics_per_node})", _gb(p.links.node_nic_bytes_per_s), "")
    tree.add("[bold]links[/bold]").add(links)
    _render_measured(tree, p)

    slurm = tree.add("[bold]slurm[/bold]")
    for key, value in d["slurm"].items():
        if value in (None, [], {}):
            continue
        if isinstance(value, dict):
            sub = slurm.add(key)
            for k, v in value.items():
                sub.add(f"{k} = {v}")
        elif isinstance(value, list):
            sub = slurm.add(key)
            for v in value:
                sub.add(str(v))
        else:
            slurm.add(f"{key} = {value}")
    refit = tree.add("[bold]refit[/bold]")
    for key, value in d["refit"].items():
        refit.add(f"{key} = {value:g}" if isinstance(value, float) else f"{key} = {value}")
    refit.add(f"[dim]bucket_bytes = {p.refit.bucket_bytes}[/dim]")
    from reshardctl.runbook.ledger import ledger_path

    tree.add(f"[bold]ledger[/bold] {escape(str(ledger_path(p)))}"
             + ("" if p.state_dir else " [dim](state_dir not set: the per-user state directory)[/dim]"))
    output.console().print(tree, markup=True, soft_wrap=False)  # long lines wrap inside the tree, never cut


def measured_json(p: SiteProfile) -> dict | None:
    """The site's calibration (``site/measured.py``) with its age, or None: datasheet figures."""
    from reshardctl.site.measured import find_measured

    m = find_measured(p)
    if m is None:
        return None
    return {"path": m.path, "date": m.date, "age_s": m.age_s(), "hosts": list(m.hosts), "versions": m.versions,
            "ranks": m.ranks, "cores": m.cores, "figures": m.figures}


def _render_measured(tree, p: SiteProfile) -> None:
    from rich.markup import escape

    from reshardctl.commands.calibrate import figures_table
    from reshardctl.site.measured import default_path, human_age

    m = measured_json(p)
    if m is None:
        tree.add(f"[bold]measured[/bold]: none (predictions use the datasheet figures above; "
                 f"`reshardctl calibrate --site {escape(p.name)}` writes {escape(str(default_path(p.name)))})")
        return
    node = tree.add(f"[bold]measured[/bold]: {escape(m['path'])}, {escape(m['date'])} "
                    f"({human_age(m['age_s'])} old), hosts {escape(', '.join(m['hosts']))}, "
                    f"torch {escape(str(m['versions'].get('torch')))}, {escape(str(m['versions'].get('backend')))}")
    node.add(figures_table(m["figures"]))


@app.command("show")
def show(
    profile: Optional[str] = typer.Argument(
        None, help=f"Profile name or file (.yaml/.yml/.toml). Default: $RESHARDCTL_SITE, else site in "
                   f"~/.config/reshardctl/config.toml, else {DEFAULT_PROFILE}."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the resolved profile as JSON (errors too, as JSON)."),
) -> None:
    """Print the resolved profile (defaults filled in, hostlists expanded) and where the site came from."""
    choice = choose_site(profile)
    p = load_profile(choice.site)  # a ProfileError: one paragraph on stderr, or JSON with --json (cli.main)
    chosen = {"source": choice.source, "text": choice.describe(), **({"file": choice.where} if choice.where else {})}
    if as_json:
        try:
            measured = measured_json(p)
        except ProfileError as exc:
            _report(exc)
            raise typer.Exit(exc.exit_code) from None
        output.print_json({**profile_to_dict(p), "derived": derived(p), "calibration": measured, "chosen_by": chosen})
    else:
        try:
            output.console().print(choice.describe(), markup=False, highlight=False)
            _render(p)
        except ProfileError as exc:
            _report(exc)
            raise typer.Exit(exc.exit_code) from None


@app.command("validate")
def validate(
    files: List[Path] = typer.Argument(..., help="Profile files to check (.yaml/.yml/.toml)."),
) -> None:
    """Check profile files: `ok <file>` for each good one, every problem of each bad one; exit 2 if any is bad."""
    bad = 0
    for f in files:
        try:
            load_profile_file(f)
        except ProfileError as exc:
            bad += 1
            _report(exc)
        else:
            output.console().print(f"ok {f}", markup=False)
    if bad:
        _report(ProfileError(f"{bad} of {len(files)} profile file(s) are invalid"))
        raise typer.Exit(ProfileError.exit_code)


@app.command("list")
def list_profiles(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON (errors too, as JSON)."),
) -> None:
    """List the profiles findable by name (RESHARDCTL_PROFILE_PATH first, then the shipped ones)."""
    rows = []
    for name, source, path in available_profiles():
        try:
            p = load_profile_file(path, source)
            summary = f"{p.num_nodes} nodes x {p.gpus_per_node} {'ranks' if p.cpu_only else 'GPUs'}"
        except ProfileError as exc:
            summary = f"invalid: {exc.message.splitlines()[0]}"
        rows.append({"name": name, "source": source, "path": str(path), "summary": summary})
    if as_json:
        output.print_json(rows)
        return
    table = output.table("name", "source", "summary", text=("source", "summary"))
    for r in rows:
        table.add_row(Text(r["name"]), Text(r["source"]), Text(r["summary"]))
    output.print_table(table)
