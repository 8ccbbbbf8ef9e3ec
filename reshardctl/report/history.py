"""The report's view over time: per site and model, every refit of the reported sources, the plan's
expectations, the site's budget and the runbook decisions of its ledger.

* ``site_ledgers(runs, site)``: per site, its profile's budget and its ledger entries (runbook/ledger.py).
  The site of a run is its ``inputs.site_source`` (the profile file it ran with), or ``site`` (the
  ``--site`` of `reshardctl report`) for every run when given. A profile that cannot be loaded or a ledger
  that does not exist yet: no entries, and ``note`` says why in one line (the page prints it); a corrupt
  ledger raises ``LedgerError`` (exit 2), as every ledger reader.
* ``histories(runs, ledgers)``: one ``History`` per (site, model) of the runs (``grouped``). An API events directory
  names no model (and a site only when its refits asked a ledger): it joins the panel of the other runs
  when they are all of one site and model, else it gets its own panel. Every panel of a site carries all
  of its ledger's promote / rollback decisions (the active transport is the site's, not a model's).
* ``week_run_dirs(entries)``: the run directories a ledger names (measure, promote, rollback), oldest
  first: those on disk, and those no longer on disk.
"""

from __future__ import annotations

import calendar
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from reshardctl.errors import InputError
from reshardctl.report.collect import History, LedgerMark, RunData, expectations
from reshardctl.runbook.ledger import Entry, ledger_path, read_ledger
from reshardctl.site.loading import load_profile
from reshardctl.site.spec import SiteProfile

API_MODEL = "API refits"


@dataclass
class SiteLedger:
    """One site's profile figures and ledger, as the report reads them."""
    site: str  # the profile's name (or how it was named, when it cannot be loaded)
    budget_s: float | None = None
    transport: str | None = None  # the profile's refit.transport: the active one before any change
    entries: list[Entry] = field(default_factory=list)
    path: Path | None = None
    note: str = ""  # why there are no entries ("" when the ledger was read)


def entry_time(e: Entry) -> float | None:
    """A ledger time (``2026-12-02T04:01:28.123Z``, UTC) as unix seconds; None when it is not one."""
    stamp, _, frac = e.time.rstrip("Z").partition(".")
    try:
        t = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return t + (int(frac) / 10 ** len(frac) if frac.isdigit() else 0.0)


def _profile_spec(run: RunData) -> str | None:
    src = run.inputs.get("site_source")
    if isinstance(src, str) and src:
        return src.removeprefix("builtin:")
    site = run.inputs.get("site")
    return site if isinstance(site, str) and site else None


def read_site(spec: str) -> SiteLedger:
    """The budget, transport and ledger of the site profile ``spec`` (a name or a file)."""
    try:
        profile: SiteProfile = load_profile(spec)
    except InputError as exc:
        return SiteLedger(spec, note=f"site {spec}: the profile cannot be loaded ({exc.message}); no budget line "
                                     "and no ledger decisions")
    path = ledger_path(profile)
    out = SiteLedger(profile.name, profile.refit.latency_budget_s, profile.refit.transport, path=path)
    if not path.exists():
        out.note = f"site {profile.name}: no ledger at {path} (no bench, promote or rollback recorded yet)"
        return out
    out.entries = read_ledger(path)  # corrupt: LedgerError, exit 2
    return out


def site_ledgers(runs: list[RunData], site: str | None = None) -> dict[str, SiteLedger]:
    """Profile spec -> its SiteLedger, for ``site`` or for each run's own profile."""
    specs = [site] if site else list(dict.fromkeys(s for s in map(_profile_spec, runs) if s))
    return {spec: read_site(spec) for spec in specs}


def run_spec(run: RunData, site: str | None) -> str | None:
    return site or _profile_spec(run)


def marks(entries: list[Entry]) -> list[LedgerMark]:
    out = []
    for e in entries:
        t = entry_time(e)
        if e.action not in ("promote", "rollback") or t is None:
            continue
        if e.action == "promote":
            label = {"promoted": f"promoted {e.transport}", "forced": f"forced {e.transport}"}.get(
                e.verdict, f"promote {e.transport} {e.verdict}")
        else:
            verified = bool(e.details.get("verify") or e.details.get("verified"))
            label = "rollback verify failed" if e.verdict == "verify_failed" else \
                "rollback (verified)" if verified else "rollback"
        out.append(LedgerMark(t, e.action, e.verdict, e.transport, label, e.changes_active))
    return out


def grouped(runs: list[RunData], site: str | None = None) -> dict[tuple[str | None, str], list[RunData]]:
    """(profile spec, model) -> its runs, in the order the runs first name them."""
    keyed: dict[tuple[str | None, str], list[RunData]] = {}
    loose: list[RunData] = []
    for run in runs:
        spec = run_spec(run, site)
        model = run.inputs.get("model")
        if run.api and not model:
            loose.append(run)
        else:
            keyed.setdefault((spec, str(model or "-")), []).append(run)
    for run in loose:  # an API events directory: the panel of the runs when there is one
        spec = run_spec(run, site)
        home = [k for k in keyed if k[0] == spec or spec is None]
        key = home[0] if len(home) == 1 else (spec, f"{API_MODEL} ({run.label})")
        keyed.setdefault(key, []).append(run)
    return keyed


def histories(runs: list[RunData], ledgers: dict[str, SiteLedger], site: str | None = None) -> list[History]:
    """One History per (site, model) of the runs (``grouped``'s order)."""
    out = []
    for (spec, model), group in grouped(runs, site).items():
        led = ledgers.get(spec) if spec else None
        h = History(site=led.site if led else spec, model=model, budget_s=led.budget_s if led else None)
        for run in group:
            h.refits += run.refits
            h.expectations += expectations(run)
        h.refits.sort(key=lambda r: r.start_unix)
        h.marks = marks(led.entries) if led else []
        out.append(h)
    return out


def week_run_dirs(entries: list[Entry]) -> tuple[list[str], list[str]]:
    """The run directories the ledger's entries name, in the order of their first entry: (on disk, gone)."""
    named = list(dict.fromkeys(e.run_dir for e in sorted(entries, key=lambda e: entry_time(e) or 0.0)
                               if e.run_dir))
    here = [d for d in named if os.path.isdir(d)]
    return here, [d for d in named if d not in here]
