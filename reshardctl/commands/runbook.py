"""`reshardctl status`, `promote` and `rollback`: the change window of a site (docs/runbook.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError, RefusedError
from reshardctl.site.default_site import choose_site

# the runbook modules are imported by each command: every command's module is imported at start (cli.py)

SITE = typer.Option(None, "--site", metavar="NAME|FILE",
                    help="Site profile name or file (its ledger is <state_dir>/<site>.ledger.jsonl); default: "
                         "$RESHARDCTL_SITE, else site in ~/.config/reshardctl/config.toml (no fallback: required).")
WRITE = typer.Option(None, "--write", help="Also write the matching framework settings (NeMo RL YAML) to FILE.")
# what is promoted / validated: the flags given (promote: over the run's own; rollback: over the last promoted run's)
LAYOUT_FLAGS = opt.refit_options(tuple(opt.RUNBOOK_OPTIONS), options=opt.RUNBOOK_OPTIONS, given=True)


def site_ref(site: str) -> str:
    """How a job's workers name the site (``RESHARDCTL_SITE``): a profile file as an absolute path (the
    job runs elsewhere), a profile name as given."""
    p = Path(site)
    return str(p.resolve()) if p.is_file() else site


def _settings(transport: str, site: str, origin: str, write: Optional[str], show: bool = True,
              layouts: tuple = (None, None)) -> None:
    from reshardctl.runbook import framework, operations

    text = framework.nemo_rl_settings(transport, site=site, origin=origin, train=layouts[0], infer=layouts[1])
    if show and not output.quiet():
        output.console().print(text.rstrip("\n"), markup=False, highlight=False)
    if write:
        operations.write_settings(write, text)
        output.info(f"framework settings written to {write}")


def status_cmd(site: Optional[str] = SITE, as_json: bool = opt.JSON) -> None:
    """Active refit transport and since when, the budget, the latest measured runs, the last rollback."""
    site = choose_site(site, required=True, what="status").site
    from reshardctl.runbook import operations
    from reshardctl.runbook.gate import seconds

    st = operations.status(site)
    if as_json:
        output.print_json(st)
        return
    con = output.console()
    a = st["active"]
    since = f"since {a['since']} ({a['set_by']})" if a["since"] else f"({a['set_by']})"
    con.print(f"site {st['site']}: active refit transport [bold]{a['transport']}[/bold] {escape(since)}")
    meets = st["active_meets_budget"]
    am = st["latest_measured"].get(a["transport"])
    if meets:  # the gate's rule: median and p90 within the budget
        said = f"yes (median {seconds(am['median_s'])}, p90 {seconds(am['p90_s'])})"
    elif meets is False:
        said = "NO (" + ("; ".join(am["over_budget_now"].values()) or "not verified") + ")"
    else:
        said = "not measured yet"
    con.print(f"budget (refit.latency_budget_s): {seconds(st['budget_s'])} on the median and the p90; "
              f"active transport meets it: {said}", markup=False)
    if a["run_dir"]:
        con.print(f"active from run: {a['run_dir']}", markup=False)
    table = output.table("transport", "measured", "median", "p90", "verified", "within budget", "run",
                         text=("run",), right=("median", "p90"))
    for t, e in st["latest_measured"].items():
        table.add_row(t, e["time"], seconds(e["median_s"]), seconds(e["p90_s"]), "yes" if e["verified"] else "NO",
                      _within(e), escape(e["run_dir"] or ""))
    if st["latest_measured"]:
        output.print_table(table, ("within budget", "verified"), con)
    else:
        con.print("no measured runs recorded yet (promote or rollback --verify record them)")
    rb = st["last_rollback"]
    if rb is None:
        con.print("last rollback: none")
    else:
        ver = {True: "verification passed", False: "verification FAILED", None: "not verified"}[rb["verified"]]
        con.print(f"last rollback: {rb['time']} ({rb['verdict']}, {ver})" + (f": {rb['reason']}" if rb["reason"] else ""),
                  markup=False)
    con.print(f"ledger: {st['ledger']} ({st['entries']} entries)", markup=False)


def _within(e: dict) -> str:
    """The "within budget" cell: ``yes``, or ``no (p90)`` naming the figures over it."""
    if e["within_budget_now"]:
        return "yes"
    over = e["over_budget_now"]
    return f"no ({', '.join(over)})" if over else "no"


@LAYOUT_FLAGS
def promote_cmd(
    site: Optional[str] = SITE,
    run: str = typer.Option(..., "--run", help="Run directory of a `reshardctl bench` run."),
    transport: str = typer.Option("reshard", "--transport", help="reshard | hybrid"),
    force: bool = typer.Option(False, "--force", help="Promote even when a condition fails (needs --reason; recorded)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (recorded in the ledger)."),
    request: dict = opt.REQUEST,
    write: Optional[str] = WRITE, as_json: bool = opt.JSON,
) -> None:
    """Make reshard (or hybrid) the site's refit transport, if the run proves it: verified, within budget,
    faster than gather-and-broadcast in the same run, same site/model/layouts, today's plan."""
    from reshardctl.runbook import framework, operations
    from reshardctl.runbook.run_record import load_run

    site = choose_site(site, required=True, what="promote").site
    if transport not in ("reshard", "hybrid"):
        raise InputError(f"--transport {transport!r}: promote takes reshard or hybrid (gather_broadcast is "
                         "`reshardctl rollback`)")
    if force and not (reason and reason.strip()):
        raise InputError("--force needs --reason TEXT: an override is recorded with its reason")
    operations.check_writable(write)
    ref = site_ref(site)
    if write:  # settings NeMo RL could not run as measured: refused before anything is recorded
        train, infer = load_run(run).layouts
        framework.nemo_rl_settings(transport, site=ref, origin="check", train=train, infer=infer)
    res = operations.promote(site, run, transport, force=force, reason=reason, expected=request)
    d = res.decision
    origin = f"promoted {d.time} from {d.run_dir}"
    settings, no_settings = None, None
    if not res.refused:
        try:
            settings = framework.nemo_rl_settings(transport, site=ref, origin=origin, train=res.run.layouts[0],
                                                  infer=res.run.layouts[1])
        except InputError as exc:
            no_settings = exc.message
    if as_json:  # stdout is the JSON object alone; the settings ride in it
        output.print_json({"decision": d.to_json(), "checks": d.details["checks"], "framework_settings": settings,
                           "framework_settings_refused": no_settings})
    else:
        con = output.console()
        table = output.table("condition", "", "numbers", text=("numbers",))
        for c in res.checks:
            table.add_row(c.name, "ok" if c.ok else "[bold red]FAILED[/bold red]", escape(c.detail))
        output.print_table(table, con=con)
    bad = [c for c in res.checks if not c.ok]
    if res.refused:
        raise RefusedError(
            f"promote {transport} on site {res.profile.name} refused: "
            + "; ".join(f"{c.name}: {c.detail}" for c in bad),
            hint=f"the refusal is recorded in {operations.ledger.ledger_path(res.profile)}; the active transport "
                 f"stays {res.active_before}. --force --reason TEXT overrides (recorded as such)")
    verb = "promoted (FORCED past: " + ", ".join(c.name for c in bad) + ")" if bad else "promoted"
    output.info(f"site {res.profile.name}: {res.active_before} -> {transport} {verb}; recorded at {d.time}")
    if no_settings:
        output.info(no_settings)
        return
    _settings(transport, ref, origin, write, show=not as_json, layouts=res.run.layouts)


@LAYOUT_FLAGS
def rollback_cmd(
    site: Optional[str] = SITE,
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (recorded in the ledger)."),
    verify: bool = typer.Option(False, "--verify",
                                help="First run a gather_broadcast validation refit; refuse (exit 1) unless verified."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; run and record nothing."),
    request: dict = opt.REQUEST,
    iters: int = typer.Option(3, "--iters", min=1, help="Timed refits of the validation run."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Untimed refits first."),
    out: Optional[str] = typer.Option(None, "--out", help="Run directory of the validation run."),
    write: Optional[str] = WRITE,
) -> None:
    """Switch the site back to gather-and-broadcast, recording why; --verify proves the rollback path first."""
    from reshardctl.runbook import framework, operations
    from reshardctl.runbook.gate import seconds

    site = choose_site(site, required=True, what="rollback").site
    operations.check_writable(write)
    if request and not verify:
        raise InputError("--model/--train/--infer and the layout flags choose the validation refit's layouts: "
                         "give them with --verify")

    def announce(inp: Any, origin: str) -> None:
        output.info(f"validation refit (gather_broadcast): {inp.model.name}: train {inp.train.describe()} -> infer "
                    f"{inp.infer.describe()} ({inp.topology.world} processes), layouts of {origin}")

    res = operations.rollback(site, reason=reason, verify=verify, dry_run=dry_run, given=request,
                              iterations=iters, warmup=warmup, out=out, argv=output.argv(), before_refit=announce)
    con = output.console()
    name = res.profile.name
    if dry_run:
        con.print(f"dry run: site {name}: active {res.active_before} -> gather_broadcast"
                  + (" (already active)" if res.active_before == "gather_broadcast" else ""), markup=False)
        if verify:
            i = res.inputs
            con.print(f"would first run a gather_broadcast validation refit ({iters} iterations) with the layouts of "
                      f"{res.inputs_origin}: model {i.get('model')}, train {i.get('train') or i.get('train_layout')}, "
                      f"infer {i.get('infer') or i.get('infer_layout')}", markup=False)
        con.print(f"would record a rollback entry in {operations.ledger.ledger_path(res.profile)}"
                  + (f" and write {write}" if write else "") + "; settings it would give:", markup=False)
        con.print(framework.nemo_rl_settings("gather_broadcast", site=site_ref(site), origin="dry run").rstrip("\n"),
                  markup=False, highlight=False)
        return
    d = res.decision
    if verify:
        s = ((res.validation.summary or {}).get("transports") or {}).get("gather_broadcast") or {}
        med = (s.get("refit_s") or {}).get("median")
        con.print(f"validation refit: {res.validation.run_dir}: gather_broadcast median {seconds(med)}, "
                  f"{'verified' if res.verified else 'NOT verified'}", markup=False)
    if res.verified is False:
        raise RefusedError(
            f"rollback on site {name} not done: the gather_broadcast validation refit was not verified "
            f"({(res.validation.summary or {}).get('error') or 'see summary.json'}); run {res.validation.run_dir}",
            hint=f"recorded as verify_failed in {operations.ledger.ledger_path(res.profile)}; the active transport "
                 f"stays {res.active_before}. Without --verify the rollback is recorded unproven")
    output.info(f"site {name}: {res.active_before} -> gather_broadcast rolled back; recorded at {d.time}")
    _settings("gather_broadcast", site_ref(site), f"rolled back {d.time}", write)
