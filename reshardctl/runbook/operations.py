"""`promote`, `rollback` and `status` as library calls: read the evidence, decide, record in the ledger.

The decision and its ledger entries are made under the ledger lock (``ledger.transaction``), so two
promotes and a rollback racing on one site serialise: each sees the history the previous one wrote.
Long work (re-planning a run, a validation refit) happens before the lock is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from reshardctl.errors import InputError
from reshardctl.runbook import gate, ledger
from reshardctl.runbook.ledger import Entry, stamped
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import Inputs, prepare
from reshardctl.runbook.run_record import RunRecord, load_run, recorded_request
from reshardctl.site import load_profile
from reshardctl.site.spec import SiteProfile


@dataclass
class PromoteResult:
    profile: SiteProfile
    run: RunRecord
    transport: str
    checks: list[gate.Check]
    decision: Entry
    active_before: str

    @property
    def refused(self) -> bool:
        return self.decision.verdict == "refused"


@dataclass
class RollbackResult:
    profile: SiteProfile
    active_before: str
    inputs: dict[str, Any] | None  # the validation refit's plan inputs (RefitRequest.plan_inputs; None without --verify)
    inputs_origin: str
    decision: Entry | None = None  # None for --dry-run
    validation: Any = None  # runs.session.SessionResult
    verified: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _prepare(site: str, request: RefitRequest, transport: str) -> Inputs:
    """``request`` resolved for ``site`` and one transport (a plan only: no run settings)."""
    return prepare(request.replace(site=site, transport=transport, run=None))


def _fingerprint_today(site: str, run: RunRecord, transport: str) -> tuple[str | None, str | None, RefitRequest]:
    """(today's fingerprint, why it could not be computed, the run's recorded request)."""
    from reshardctl.plan.planner import build_plan

    request = recorded_request(run)  # none (an older run's) or a bad one is bad input (exit 2), not a stale run
    try:
        inp = _prepare(site, request, transport)
        plan = build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=transport,
                          bucket_bytes=inp.bucket_bytes, relay=inp.relay)
    except InputError as exc:
        return None, str(exc).splitlines()[0], request
    return plan.fingerprint, None, request


def _measures(profile: SiteProfile, run: RunRecord, known: list[Entry]) -> list[Entry]:
    """One ``measure`` entry per transport of ``run`` not yet in the ledger."""
    seen = {(e.run_dir, e.transport) for e in known if e.action == "measure"}
    budget = profile.refit.latency_budget_s
    out = []
    for t in run.transports:
        if (str(run.run_dir), t) in seen:
            continue
        med = run.figure(t)
        verdict = ("not_verified" if not run.verified(t) else
                   "over_budget" if gate.over_budget(med, run.figure(t, "p90"), budget) else "within_budget")
        out.append(stamped(dict(site=profile.name, action="measure", transport=t, verdict=verdict,
                                run_dir=str(run.run_dir), plan_fingerprint=run.fingerprint(t), median_s=med,
                                p90_s=run.figure(t, "p90"), budget_s=budget,
                                details={"model": run.model, "train": run.layouts[0], "infer": run.layouts[1]})))
    return out


def promote(site: str, run_dir: str, transport: str, *, expected: Mapping[str, Any] | None = None,
            force: bool = False, reason: str | None = None) -> PromoteResult:
    """``expected``: the plan inputs the command line gave (``PLAN_INPUTS`` keys), compared with the run's."""
    profile = load_profile(site)
    run = load_run(run_dir)
    today, why, request = _fingerprint_today(site, run, transport)
    expected_cli = None
    if expected:  # flags not given are the run's own (``--model X`` alone compares the model)
        inp = _prepare(site, request.replace(**expected), transport)
        expected_cli = gate.Expected(inp.model.name, inp.train.describe(), inp.infer.describe(), "the command line")
    with ledger.transaction(ledger.ledger_path(profile)) as txn:
        before, _ = ledger.active(txn.entries, profile)
        expected = expected_cli
        last = ledger.last(txn.entries, "promote", ("promoted", "forced"))
        if expected is None and last is not None and last.details.get("model"):
            d = last.details
            expected = gate.Expected(d.get("model"), d.get("train"), d.get("infer"), f"the last promotion ({last.time})")
        checks = gate.evaluate(run, transport, profile, expected=expected, current_fingerprint=today, replan_error=why)
        bad = gate.failed(checks)
        verdict = "promoted" if not bad else ("forced" if force else "refused")
        for m in _measures(profile, run, txn.entries):
            txn.append(m)
        decision = txn.append(stamped(dict(
            site=profile.name, action="promote", transport=transport, verdict=verdict, run_dir=str(run.run_dir),
            plan_fingerprint=run.fingerprint(transport), median_s=run.figure(transport),
            p90_s=run.figure(transport, "p90"), budget_s=profile.refit.latency_budget_s, reason=reason,
            details={"active_before": before, "forced": verdict == "forced",
                     "failed": [c.name for c in bad],
                     "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
                     "model": run.model, "train": run.layouts[0], "infer": run.layouts[1],
                     "inputs": request.plan_inputs()})))
    return PromoteResult(profile, run, transport, checks, decision, before)


def rollback_inputs(profile: SiteProfile, entries: list[Entry], given: Mapping[str, Any] | None
                    ) -> tuple[RefitRequest, str]:
    """The validation refit's request and where its inputs come from: the flags ``given`` on the command
    line (which must name the model: none is assumed; the other options keep their defaults), else the
    last promoted run's inputs recorded in the ledger."""
    if given:
        if "model" not in given:
            raise InputError(f"rollback --verify on site {profile.name}: the layout flags name no --model "
                             "(no model is assumed)", hint="add --model M (a preset or a path)")
        return RefitRequest(**given), "the command line"
    last = ledger.last(entries, "promote", ("promoted", "forced"))
    inputs = last.details.get("inputs") if last is not None else None
    if isinstance(inputs, dict) and inputs.get("model") is not None:
        # the options not recorded (None, or mtp in a ledger of older code) keep their defaults
        return (RefitRequest(**{k: v for k, v in inputs.items() if v is not None}),
                f"the last promoted run ({last.run_dir}, {last.time})")
    raise InputError(f"rollback --verify on site {profile.name}: no layouts to validate with (no promotion in the "
                     f"ledger {ledger.ledger_path(profile)} records its inputs)",
                     hint="give them: --model M --train SPEC --infer SPEC (or --train-layout/--infer-layout)")


def rollback(site: str, *, reason: str | None = None, verify: bool = False, dry_run: bool = False,
             given: Mapping[str, Any] | None = None, iterations: int = 3, warmup: int = 1,
             out: str | None = None, argv: list[str] | None = None,
             before_refit: Callable[[Any, str], None] | None = None) -> RollbackResult:
    from reshardctl.runbook import validation

    profile = load_profile(site)
    path = ledger.ledger_path(profile)
    entries = ledger.read_ledger(path)
    before, _ = ledger.active(entries, profile)
    inputs, origin, inp = None, "", None
    if verify:
        request, origin = rollback_inputs(profile, entries, given)
        inputs = request.plan_inputs()
        request = request.replace(site=site, transport=validation.TRANSPORT, run=validation.settings(
            iterations=iterations, warmup=warmup, launcher=profile.launcher))
        inp = prepare(request)  # bad layouts: exit 2 before anything runs
    result = RollbackResult(profile, before, inputs, origin)
    if dry_run:
        return result
    run = None
    if verify:
        if before_refit is not None:
            before_refit(inp, origin)
        result.validation = validation.validation_refit(inp, out=out, argv=argv)
        result.verified = validation.verified(result.validation)
        try:
            run = load_run(result.validation.run_dir)
        except InputError:  # a session that died before its summary: recorded as not verified
            run = None
            result.verified = False
    with ledger.transaction(path) as txn:
        result.active_before, _ = ledger.active(txn.entries, profile)
        if run is not None:
            for m in _measures(profile, run, txn.entries):
                txn.append(m)
        ok = result.verified is not False
        result.decision = txn.append(stamped(dict(
            site=profile.name, action="rollback", transport=validation.TRANSPORT,
            verdict="rolled_back" if ok else "verify_failed",
            run_dir=None if result.validation is None else str(Path(result.validation.run_dir).resolve()),
            plan_fingerprint=None if run is None else run.fingerprint(validation.TRANSPORT),
            median_s=None if run is None else run.figure(validation.TRANSPORT),
            p90_s=None if run is None else run.figure(validation.TRANSPORT, "p90"),
            budget_s=profile.refit.latency_budget_s, reason=reason,
            details={"active_before": result.active_before, "verify": verify, "verified": result.verified,
                     "inputs": inputs,
                     "error": None if result.validation is None else (result.validation.summary or {}).get("error")})))
    return result


def status(site: str) -> dict[str, Any]:
    profile = load_profile(site)
    path = ledger.ledger_path(profile)
    entries = ledger.read_ledger(path)
    transport, since = ledger.active(entries, profile)
    budget = profile.refit.latency_budget_s
    measured = ledger.latest_measured(entries)
    am = measured.get(transport)
    rb = ledger.last(entries, "rollback")

    def brief(e: Entry | None) -> dict | None:
        if e is None:
            return None
        return {"time": e.time, "user": e.user, "host": e.host, "verdict": e.verdict, "run_dir": e.run_dir,
                "median_s": e.median_s, "p90_s": e.p90_s, "plan_fingerprint": e.plan_fingerprint, "reason": e.reason}

    def against_budget(e: Entry) -> dict:
        """Today's budget on the tail too, as the promotion gate (runbook/gate.py): median and p90 within it."""
        over = gate.over_budget(e.median_s, e.p90_s, budget)
        return {"within_budget_now": e.verdict != "not_verified" and not over, "over_budget_now": over}

    return {
        "site": profile.name,
        "ledger": str(path),
        "entries": len(entries),
        "budget_s": budget,
        "active": {"transport": transport, "since": since.time if since else None,
                   "set_by": f"{since.action} by {since.user}@{since.host}" if since else
                   f"the profile's refit.transport ({profile.source}); no change recorded",
                   "run_dir": since.run_dir if since else None,
                   "reason": since.reason if since else None},
        "latest_measured": {t: {**brief(e), "budget_s_then": e.budget_s, "verified": e.verdict != "not_verified",
                                **against_budget(e)} for t, e in measured.items()},
        "active_meets_budget": None if am is None or am.verdict == "not_verified" else (
            against_budget(am)["within_budget_now"]),
        "last_rollback": None if rb is None else {**brief(rb), "verify": rb.details.get("verify"),
                                                  "verified": rb.details.get("verified")},
    }


def write_settings(path: str, text: str) -> Path:
    from reshardctl.atomic_write import write_text_atomic
    from reshardctl.errors import OutputError

    p = Path(path)
    try:
        return write_text_atomic(p, text)
    except OSError as exc:
        raise OutputError(f"--write {path}: cannot be written: {exc.strerror or exc}") from None


def check_writable(path: str | None) -> None:
    """Bad ``--write`` targets are bad input before anything is decided or recorded: a directory, a device
    or FIFO (only regular files are written), a missing directory."""
    from reshardctl.atomic_write import output_problem
    from reshardctl.errors import OutputError

    if path is None:
        return
    p = Path(path)
    why = output_problem(p)
    if why:
        raise OutputError(f"--write {path}: {why}")
    if not p.parent.is_dir():
        raise OutputError(f"--write {path}: directory {p.parent} does not exist")
