"""One refit of one rank: common start (readiness + agreement) -> execute -> verify -> vote -> swap ->
acknowledge, and on a failure after the common start, the repair among the inference ranks (commit.py,
docs/commit-protocol.md). Shared by the worker (``reshardctl run``) and the API; fault drills come in only through the
optional ``drills`` object, which only the worker passes.

Every failure ends here as a raised ``TransferError``/``VerificationError`` carrying a ``record`` (rank,
host, side, phase, step, round/bucket, peers, unix time, knock_on) for the report; a rank that fails
publishes it in the run's store first, so every other rank stops waiting at once (groups.py) instead of
running into its own timeouts one call after another.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import time

from reshardctl.errors import TransferError
from reshardctl.runtime import commit as _commit
from reshardctl.runtime.contract import IterationReport, RunOptions
from reshardctl.runtime.env import RankEnv
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.failure_record import FailureRecord
from reshardctl.runtime.executor import Executor
from reshardctl.runtime.abort import abort_after_failure
from reshardctl.runtime.bounded_wait import Abandoned
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.synthetic_weights import SyntheticWeights, restep_

HOST = socket.gethostname()


@dataclasses.dataclass
class State:
    """One rank's weights across refits."""

    src: LocalWeights | None = None
    current: LocalWeights | None = None
    staged: LocalWeights | None = None
    src_step: int | None = None
    committed_step: int | None = None
    previous_step: int | None = None  # the step the staged copy still holds after a commit
    previous_valid: bool = False  # staged holds exactly ``previous_step`` (no byte of a later refit yet)


def advance_source(plan, st: State, source, step: int) -> None:
    if isinstance(source, SyntheticWeights) and st.src_step is not None and st.src_step != step:
        for i, ts in st.src.data.items():
            for t in ts:
                restep_(plan.model.tensors[i], t, st.src_step, step)
    st.src_step = step


def failure_record(env: RankEnv, phase: str, step: int, exc: BaseException) -> dict:
    """This rank's ``FailureRecord`` (wire form) for ``exc`` in ``phase`` of ``step``."""
    where = getattr(exc, "where", None) or {}
    return FailureRecord(
        rank=env.global_rank, host=HOST, side=env.side, side_rank=env.side_rank, phase=phase, step=step,
        round=where.get("index"), step_kind=where.get("kind"), peers=where.get("peers"), at=time.time(),
        knock_on=isinstance(exc, Abandoned) or bool(getattr(exc, "knock_on", False)),
    ).to_json()


_GLOO_SOURCE = re.compile(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ")
_GLOO_ADVICE = re.compile(r"\s*This is typically caused by .*$", re.S)


def tidy(message: str) -> str:
    """A backend message without its source location and boilerplate advice."""
    return _GLOO_ADVICE.sub("", _GLOO_SOURCE.sub("", message)).strip()


def _fail(groups: Groups, env: RankEnv, phase: str, step: int, exc: BaseException) -> BaseException:
    """Attach the failure record, publish it (unless it is itself a knock-on) and return the error."""
    rec = failure_record(env, phase, step, exc)
    if not isinstance(exc, TransferError):
        exc = TransferError(f"rank {env.global_rank}: {type(exc).__name__}: {exc}")
    text = tidy(exc.message)
    if text != exc.message:
        where = getattr(exc, "where", None)
        exc = type(exc)(text, hint=exc.hint)
        exc.where = where
    exc.record = rec
    if not rec["knock_on"]:
        groups.publish_failure(f"rank {env.global_rank} ({env.side} {env.side_rank}, {HOST}) failed in "
                               f"{phase} of step {step}: {exc}")
    return exc


def common_start(groups: Groups, st: State, train_world: int, step: int, not_ready: str | None,
                 events: EventLog) -> None:
    """Readiness vote and agreement on the committed step, in one control-plane all-reduce. A rank ahead
    of the others rolls back to the previous weights it still holds (a safety net: under one failure the
    commit and its repair leave nobody ahead, docs/commit-protocol.md)."""
    env = groups.env
    ready, steps = _commit.gather_steps(groups, 0 if not_ready else 1, st.committed_step)
    missing = [r for r, x in enumerate(ready) if x == 0]
    if missing:
        here = f"; here: {not_ready}" if not_ready else ""
        err = TransferError(f"refit of step {step} not started (nothing moved, nothing committed): "
                            f"rank(s) {missing} not ready{here}")
        err.knock_on = not_ready is None
        raise err
    low, ahead = _commit.agree(steps, train_world)
    if env.global_rank in ahead:
        if not (st.previous_valid and st.previous_step == low and st.current is not None):
            raise TransferError(f"inference ranks disagree on the committed step ({steps[train_world:]}) and "
                                f"rank {env.global_rank} no longer holds step {low}")
        with events.phase("rollback", step=step, committed=st.committed_step, to=low):
            st.current.swap_data(st.staged)
            st.committed_step, st.previous_valid = low, False


@dataclasses.dataclass(frozen=True)
class RefitContext:
    """What stays the same across one rank's refits of one plan: the plan, the rank's process groups, its
    executor, the run options, its event log and (worker only) the fault drills."""

    plan: object
    groups: Groups
    executor: Executor
    options: RunOptions
    events: EventLog
    drills: object | None = None


def _swap_in(st: State, step: int) -> None:
    """Commit ``step`` here: the staged copy (its verified bytes) becomes the served one; the previous
    weights stay in the staged copy (``previous_valid``) until the next refit's bytes arrive."""
    if st.committed_step == step:
        return
    if st.current is not None:
        st.current.swap_data(st.staged)
        st.previous_step, st.previous_valid = st.committed_step, True
    st.committed_step = step


def _fail_and_repair(ctx: "RefitContext", st: State, phase: str, step: int, exc: BaseException,
                     known: int) -> BaseException:
    """A failure of this rank's refit after the common start: publish it (``_fail``), then, on an
    inference rank, the repair with the other inference ranks (``commit.repair``): commit when any of
    them had the vote's all-OK result, else keep the previous weights. The returned error says which."""
    groups, env, events, drills = ctx.groups, ctx.groups.env, ctx.events, ctx.drills
    err = _fail(groups, env, phase, step, exc)
    if env.side != "infer":
        return err
    if drills is not None:
        drills.at("repair", step)
    with events.phase("repair", step=step, known=_commit.KNOWS[known]) as ph:
        decision, answers, note = _commit.repair(groups, step, known, ctx.options.timeout_s)
        if decision == _commit.COMMIT:
            _swap_in(st, step)
        ph.update(decision=_commit.KNOWS[decision], answers={str(p): a for p, a in answers.items()},
                  committed_step=st.committed_step)
    out = type(err)(f"{err.message}; {note}; this rank holds step {st.committed_step}", hint=err.hint)
    out.record, out.where = err.record, getattr(err, "where", None)
    return out


def _tree_hook(drills, phase: str, step: int):
    """(the drill point called when a tree all-reduce's result arrives, whether to run it in the main
    thread: a hang there must stop the whole rank)."""
    if drills is None:
        return None, False
    return (lambda: drills.at(phase, step)), drills.hangs(phase, step)


def refit_once(ctx: RefitContext, st: State, source, step: int, not_ready: str | None = None) -> IterationReport:
    """``_refit_once``; any failure out of it first aborts reshardctl's communicators (on CUDA, at once:
    abort.abort_after_failure), then propagates."""
    try:
        return _refit_once(ctx, st, source, step, not_ready)
    except BaseException:
        abort_after_failure(ctx.groups)
        raise


def _refit_once(ctx: RefitContext, st: State, source, step: int, not_ready: str | None = None) -> IterationReport:
    """One refit of this rank. Raises ``VerificationError``/``TransferError`` (with ``.record``) unless
    every rank voted OK and this rank learned that every rank had that result (then every inference rank
    swapped); an inference rank whose refit failed after the common start has repaired first (its error
    says what it holds)."""
    plan, groups, ex, options, events, drills = ctx.plan, ctx.groups, ctx.executor, ctx.options, ctx.events, ctx.drills
    env = groups.env
    phase = "start"
    try:
        common_start(groups, st, plan.train_world, step, not_ready, events)
    except TransferError as exc:
        raise _fail(groups, env, phase, step, exc) from None
    if drills is not None:
        drills.at("start", step)
    phase = "transfer"
    if drills is not None:
        drills.at("transfer", step)
    t0 = time.perf_counter()
    local_error: BaseException | None = None
    stats = None
    if st.staged is not None:
        st.previous_valid = False  # bytes of this refit may land in the staged copy from now on
    try:
        stats = ex.run(step, st.src, st.staged)
        if drills is not None:
            factor = drills.slow_factor(step)
            if factor > 1:
                time.sleep((factor - 1) * (time.perf_counter() - t0))
    except Exception as exc:  # noqa: BLE001 - every failure becomes this rank's record
        local_error = exc
    transfer_s = time.perf_counter() - t0
    if local_error is not None:  # this rank's verdict never leaves: nobody can commit
        raise _fail_and_repair(ctx, st, phase, step, local_error, _commit.ABORT)
    phase = "verify"
    if drills is not None:
        drills.at("verify", step)
    t1 = time.perf_counter()
    full_s = 0.0
    failed: BaseException | None = None
    known = _commit.ABORT
    with events.phase("verify", step=step) as ph:
        problems: list[str] = []
        try:
            ex.exchange_checksums()
            problems = ex.checksum_failures()
            if st.staged is not None:  # coverage (every element written once) is the program's, checked once
                if options.full_check and not problems:
                    tf = time.perf_counter()
                    with events.phase("verify/full", step=step):
                        problems += _commit.full_check(st.staged, source, step)
                    full_s = time.perf_counter() - tf
            code = _commit.BAD_DATA if problems else _commit.OK
            ph["verdict"] = code
            if problems:
                ph["problems"] = problems[:5]
            hook, in_main = _tree_hook(drills, "vote", step)
            codes, _ = _commit.vote(groups, code, hook, in_main)
        except Exception as exc:  # noqa: BLE001
            failed, known = exc, getattr(exc, "known", _commit.ABORT)  # ABORT: the verdict never left
        if failed is not None:
            ph["error"] = str(failed)
    if failed is not None:
        raise _fail_and_repair(ctx, st, phase, step, failed, known)
    verify_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    phase = "commit"
    with events.phase("commit", step=step) as ph:
        try:
            _commit.decide(codes, plan.train_world, step, problems, None)
        except TransferError as exc:
            exc.record = failure_record(env, "verify" if problems else phase, step, exc)
            exc.record["knock_on"] = not problems
            raise
        if drills is not None:
            drills.at("commit", step)
        _swap_in(st, step)
        ph["swapped"] = True
        if drills is not None:
            drills.at("swapped", step)
        try:
            hook, in_main = _tree_hook(drills, "ack", step)
            lost_child = _commit.learn(groups, step, hook, in_main)
        except Exception as exc:  # noqa: BLE001
            failed = exc
        if failed is None:
            _commit.mark_acked(groups, step)
            ph["committed"] = True
            if lost_child is not None:
                ph["lost_child"] = str(lost_child)
    if failed is not None:  # every rank voted OK and this one swapped: the repair tells the others
        raise _fail_and_repair(ctx, st, phase, step, failed, _commit.COMMIT)
    if drills is not None:
        drills.at("done", step)
    return IterationReport(
        step=step, committed=True, transfer_s=transfer_s, verify_s=verify_s,
        commit_s=time.perf_counter() - t2, full_check_s=full_s,
        bytes_sent=stats.bytes_sent, bytes_received=stats.bytes_received, wire_bytes=stats.wire_bytes,
        transport=plan.transport,
    )
