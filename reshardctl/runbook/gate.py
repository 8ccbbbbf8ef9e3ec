"""The promotion gate: may this run's transport become the site's active refit transport?

Pure given its inputs (the run, the site profile, what is expected, today's plan fingerprint). Every
condition is evaluated, so a refusal lists all that failed, each with its numbers:

1. ``site``: the run was made for this site.
2. ``model and layouts``: the run's model and layouts are the ones being promoted (named on the command
   line, else those of the site's last promotion).
3. ``verified``: the run measured the transport and verified every byte of every iteration.
4. ``budget``: its median and its p90 refit are within the site's ``refit.latency_budget_s`` (the
   tail too: a refit that meets the budget half of the time does not meet it).
5. ``beats gather_broadcast``: gather-and-broadcast was measured in the same run (a `bench` run),
   verified, slower than the transport at the median, and not faster at the p90 (a faster median
   with a worse tail is refused).
6. ``plan fingerprint``: planning the run's inputs today gives the plan the run measured (a run of an
   older plan, e.g. before a profile or planner change, is stale).
"""

from __future__ import annotations

from dataclasses import dataclass

from reshardctl.runbook.run_record import RunRecord
from reshardctl.site.spec import SiteProfile

BASELINE = "gather_broadcast"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Expected:
    """What is being promoted: model name and layout descriptions, and where that came from."""

    model: str
    train: str
    infer: str
    origin: str  # "the command line" or "the last promotion (<time>)"


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f} s" if x >= 1 else f"{x * 1e3:.1f} ms"


def ratio(x: float, base: float) -> str:
    """``2.27x faster`` / ``1.33x the baseline's time``: ``x`` seconds against the baseline's ``base``."""
    if x > 0 and x < base:
        return f"{base / x:.2f}x faster"
    return f"{x / base:.2f}x the baseline's time" if base > 0 else "the baseline took no time"


def over_budget(median_s: float | None, p90_s: float | None, budget_s: float) -> dict[str, str]:
    """The figures of a measurement over the budget: ``{"p90": "p90 45.0 ms > budget 40.0 ms"}``; empty when
    its median and its p90 are both within it (the tail too). A missing figure is never within the budget."""
    return {k: f"{k} {seconds(v)} > budget {seconds(budget_s)}" if v is not None else f"no {k} measured"
            for k, v in (("median", median_s), ("p90", p90_s)) if v is None or v > budget_s}


def evaluate(run: RunRecord, transport: str, profile: SiteProfile, *, expected: Expected | None,
             current_fingerprint: str | None, replan_error: str | None = None) -> list[Check]:
    checks: list[Check] = []
    checks.append(Check("site", run.site == profile.name,
                        f"run made for site {run.site!r}, promoting on site {profile.name!r}"))

    train, infer = run.layouts
    if expected is None:
        checks.append(Check("model and layouts", True,
                            f"{run.model}: train {train} -> infer {infer} (no earlier promotion to compare with)"))
    else:
        diffs = [f"{what} {got!r} != {want!r}" for what, got, want in
                 (("model", run.model, expected.model), ("train", train, expected.train),
                  ("infer", infer, expected.infer)) if got != want]
        checks.append(Check("model and layouts", not diffs,
                            (f"{run.model}: train {train} -> infer {infer}, as {expected.origin}" if not diffs else
                             f"the run differs from {expected.origin}: " + "; ".join(diffs))))

    s = run.transports.get(transport)
    med = run.figure(transport)
    if s is None:
        checks.append(Check("verified", False, f"the run did not measure {transport} (it measured "
                                               f"{', '.join(run.transports) or 'nothing'})"))
    elif run.verified(transport):
        checks.append(Check("verified", True, f"{s.get('iterations')} iterations, every byte verified"))
    else:
        fails = s.get("failures") or []
        first = (f"; first failure: rank {fails[0].get('rank')}: {fails[0].get('error')}: {fails[0].get('message')}"
                 if fails else "")
        checks.append(Check("verified", False, f"{transport} was not verified ({len(fails)} failing ranks, "
                                               f"{s.get('iterations') or 0} iterations){first}"))

    budget = profile.refit.latency_budget_s
    p90 = run.figure(transport, "p90")
    if med is None or p90 is None:
        checks.append(Check("budget", False, f"no median or p90 refit time for {transport} in the run"))
    else:
        over = over_budget(med, p90, budget)
        checks.append(Check("budget", not over,
                            (f"median {seconds(med)}, p90 {seconds(p90)} <= budget {seconds(budget)}" if not over else
                             "; ".join(over.values())) + f" (refit.latency_budget_s of {profile.source})"))

    base, base_p90 = run.figure(BASELINE), run.figure(BASELINE, "p90")
    if transport == BASELINE:
        checks.append(Check("beats gather_broadcast", False, "gather_broadcast is the rollback target: use "
                                                             "`reshardctl rollback`"))
    elif base is None:
        checks.append(Check("beats gather_broadcast", False, "gather_broadcast was not measured in the same run "
                                                             "(use `reshardctl bench`, which measures all transports)"))
    elif not run.verified(BASELINE):
        checks.append(Check("beats gather_broadcast", False, "gather_broadcast in the same run was not verified, "
                                                             "so there is nothing sound to compare with"))
    elif med is None or p90 is None or base_p90 is None:
        checks.append(Check("beats gather_broadcast", False, f"no median or p90 for {transport} or gather_broadcast"))
    else:
        faster, tail_ok = med < base, p90 <= base_p90
        why = [] if faster else ["its median is not faster"]
        why += [] if tail_ok else ["its p90 is worse"]
        checks.append(Check("beats gather_broadcast", faster and tail_ok,
                            f"median {seconds(med)} vs gather_broadcast {seconds(base)} ({ratio(med, base)}); "
                            f"p90 {seconds(p90)} vs {seconds(base_p90)} ({ratio(p90, base_p90)})"
                            + (f": {' and '.join(why)} than gather_broadcast's" if why else "")))

    fp = run.fingerprint(transport)
    if replan_error is not None:
        checks.append(Check("plan fingerprint", False, f"the run's inputs cannot be planned today: {replan_error}"))
    elif current_fingerprint is None or fp is None:
        checks.append(Check("plan fingerprint", False,
                            f"no fingerprint to compare (run: {fp}, today: {current_fingerprint})"))
    else:
        ok = fp == current_fingerprint
        checks.append(Check("plan fingerprint", ok,
                            f"run {fp} == today's plan" if ok else
                            f"run measured plan {fp}, but these inputs plan to {current_fingerprint} today (the "
                            "profile, the bucket or the planner changed since): the run is stale, bench again"))
    return checks


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]
