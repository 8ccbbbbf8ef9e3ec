"""One rank of a refit run: rendezvous -> groups -> materialise -> per refit: execute -> verify -> commit.

``run_rank_session(env, plans, options)`` is the core (the local launcher's rank processes call it
in-process); it never raises for a failed refit: each returned ``RankReport`` says ``ok=False`` with the
error (``raise_for_status``). Module entry (one process per rank, rank read from the environment, see
``env.py``; what each Slurm task runs)::

    python -m reshardctl.runtime.worker --session SESSION_FILE

The session file (``session_file.py``, the same format for both launchers) holds the planner's plans,
the run options and the warm-up; this rank derives its own steps from them. It is loaded only when this
rank's user owns it and its directory and nobody else can write either (``trusted_file.read_trusted``:
checked on the opened descriptors, exit 2 and nothing loaded otherwise, as for a missing file); the
process runs with umask 077 (its files 0600, directories 0700). The reports go to
``<run_dir>/reports/rank-<N>.json`` (atomically, 0600). The run token travels in the session's options
(a launcher's one random token for every rank of a run; never on a command line), else
``RESHARDCTL_RUN_TOKEN``. Exit status 0 = this rank's refits all committed; the process exits without
tearing its groups down (after a failure a dead peer's pending ops could hold that up).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

from reshardctl.atomic_write import atomic_path, write_json_atomic
from reshardctl.errors import LaunchError, ReshardError, TransferError
from reshardctl.runtime import commit as _commit
from reshardctl.runtime.baseline import raw_transfer
from reshardctl.runtime.contract import RankReport, RunOptions
from reshardctl.runtime.drills import Drills, parse_faults
from reshardctl.runtime.env import RankEnv, read_rank_env
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.executor import Executor
from reshardctl.runtime.groups import Groups, init_groups, rebuild, rendezvous, shutdown
from reshardctl.runtime.preconnect import preconnect
from reshardctl.runtime.settle import settle
from reshardctl.plan.gpu_memory import pool_limit_bytes
from reshardctl.runtime.buffer_pool import BufferPool
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.report_wait import await_reports
from reshardctl.runtime.refit import HOST, RefitContext, State, advance_source, failure_record, refit_once
from reshardctl.runtime.synthetic_weights import SyntheticWeights
from reshardctl.runtime.time_limit import TimeLimit, arm
from reshardctl.runtime.program import compile_program
from reshardctl.runtime.session_file import read_session
from reshardctl.runtime.weights import weight_source


def _dump(options: RunOptions, env: RankEnv, plan, st: State) -> None:
    if not (options.dump_weights and options.run_dir and st.current is not None):
        return
    path = Path(options.run_dir) / "weights" / f"rank-{env.global_rank}.pt"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with atomic_path(path, mode=0o600) as tmp:
        torch.save(
            {
                "step": st.committed_step,
                "holdings": dict(st.current.boxes),
                "tensors": {i: [t.to("cpu", copy=True) for t in ts] for i, ts in st.current.data.items()},
            },
            tmp,
        )


def _same_layout(a, b, side: str, rank: int) -> bool:
    if a is None or a.model.tensors != b.model.tensors:
        return False
    if side == "train":
        return dict(a.src_holdings(rank)) == dict(b.src_holdings(rank))
    return dict(a.dst_holdings(rank)) == dict(b.dst_holdings(rank))


def _prepare_weights(prev, plan, env: RankEnv, st: State, source, options: RunOptions, step: int,
                     device, events: EventLog, order) -> float:
    """Weights for ``plan``'s refits starting at ``step``: carried over from the previous plan of the
    session when this rank's holdings are the same, materialised otherwise, in one arena whose boxes
    follow ``order`` (the program's first use, arena.py). Returns the seconds spent."""
    if _same_layout(prev, plan, env.side, env.side_rank):
        return 0.0
    with events.phase("materialise", step=step) as ph:
        t = time.perf_counter()
        if env.side == "train":
            holdings = plan.src_holdings(env.side_rank)
            st.src = None
            st.src = LocalWeights.in_arena(plan.model, holdings, device,
                                           lambda i, b: source.region(i, b, step, device), order=order)
            st.src_step = step
            ph["bytes"] = st.src.nbytes
        else:
            holdings = plan.dst_holdings(env.side_rank)
            st.current = st.staged = None
            fill = None
            if st.committed_step is not None or options.initial_weights == "synthetic":
                at = st.committed_step if st.committed_step is not None else step - 1
                synthetic = SyntheticWeights(plan.model)
                fill = lambda i, b: synthetic.region(i, b, at, device)  # noqa: E731
                st.committed_step = at
            st.current = LocalWeights.in_arena(plan.model, holdings, device, fill, order=order)
            st.staged = LocalWeights.in_arena(plan.model, holdings, device, order=order)
            ph["bytes"] = st.staged.nbytes
        return time.perf_counter() - t


def _retry_or_raise(exc: BaseException, attempt: int, options: RunOptions, store, env: RankEnv,
                    events: EventLog, step: int) -> None:
    """After a failed attempt: raise unless a retry is allowed and every rank settled."""
    if attempt >= options.retries:
        raise exc
    with events.phase("settle", step=step, attempt=attempt) as ph:
        missing = settle(store, env, attempt, options.timeout_s, cause=exc)
        ph["missing"] = missing
    if missing:
        raise TransferError(f"{exc}; no retry: rank(s) {missing} did not settle, or saw a lost peer (settling "
                            f"waits at most {options.timeout_s:g} s)") from exc


def _connect(groups: Groups, plans: list, options: RunOptions, drills: Drills, events: EventLog, step: int) -> None:
    """The bounded pre-connect after the groups are built (preconnect.preconnect), its failure recorded in
    phase ``connect`` for the step whose refit was to follow."""
    with events.phase("connect", step=step, attempt=groups.attempt) as ph:
        drills.at("connect", step)
        try:
            ph.update(preconnect(groups, plans, options.timeout_s))
        except TransferError as exc:
            exc.record = failure_record(groups.env, "connect", step, exc)
            raise


def run_rank_session(env: RankEnv, plans, options: RunOptions, *, warmup: int = 0,
                fallback=None, time_limit: TimeLimit | None = None) -> dict[str, RankReport]:
    """One rendezvous and one process group for several plans (same worlds), run in order: per plan
    ``warmup`` untimed refits, then ``options.iterations`` timed ones (every refit committed, the training
    step advancing by one each time, inference weights carried from plan to plan), then, with
    ``options.baseline``, the raw transfer of the same bytes. A failed refit is retried up to
    ``options.retries`` times, after every rank settled, on freshly built groups (with ``on_failure ==
    "fallback"`` on the ``fallback`` plan, gather-and-broadcast, whose groups exist from the start).
    Never raises for a failed refit: the failing plan's report (and every later plan's) says ``ok=False``.
    ``time_limit``: the job's time-limit signal (runtime/time_limit.py): before each refit the ranks agree
    whether it arrived, and all stop there (``TimeLimitStop``)."""
    names = list(plans)
    if not names:
        raise TransferError("run_rank_session needs at least one plan")
    first = plans[names[0]]
    for n in names[1:]:
        q = plans[n]
        if (q.train_world, q.infer_world) != (first.train_world, first.infer_world):
            raise LaunchError(f"plan {n!r} is {q.train_world}->{q.infer_world} ranks but {names[0]!r} is "
                              f"{first.train_world}->{first.infer_world}: a session shares one set of processes")
    use_fallback = options.on_failure == "fallback" and fallback is not None and options.retries > 0
    events = EventLog(options.run_dir, env.global_rank, env.side, fingerprint=first.fingerprint)
    drills = Drills(parse_faults(options.faults), env.global_rank, events)
    st = State()
    info: dict = {"backend": env.backend}
    per_plan: dict[str, dict] = {n: {"iterations": [], "baseline": {}, "peak": 0, "materialise_s": 0.0,
                                     "attempts": []} for n in names}
    error: BaseException | None = None
    failed_plan: str | None = names[0]
    all_plans = [plans[n] for n in names] + ([fallback] if use_fallback else [])
    groups = None
    try:
        timeout = options.timeout_s
        with events.phase("rendezvous", peers=[env.master_addr, env.master_port]):
            t = time.perf_counter()
            store = rendezvous(env, options.rendezvous_timeout_s or timeout, options.token)
            info["rendezvous_s"] = time.perf_counter() - t
        with events.phase("group_init", backend=env.backend):
            t = time.perf_counter()
            groups = init_groups(env, all_plans, store, timeout)
            info["group_init_s"] = time.perf_counter() - t
            if groups.notes:  # a user's NCCL setting overridden so torch's monitor cannot kill this rank
                events.record("nccl_settings", time.time(), 0.0, notes=groups.notes)
        _connect(groups, all_plans, options, drills, events, options.first_step)
        device = groups.device
        info["device"] = str(device)
        step = options.first_step
        prev = None
        for name in names:
            plan = plans[name]
            rec = per_plan[name]
            failed_plan = name
            if len(names) > 1:
                events.common.update(fingerprint=plan.fingerprint, plan=name)
            with events.phase("materialise/open", checkpoint=options.checkpoint):
                source = weight_source(plan.model, options.checkpoint)
            if st.src is not None and st.src_step != step and _same_layout(prev, plan, env.side, env.side_rank):
                with events.phase("materialise", step=step):
                    advance_source(plan, st, source, step)
            with events.phase("program") as ph:
                program = compile_program(plan, env.global_rank)
                ph.update(program.counts)
            rec["materialise_s"] = _prepare_weights(prev, plan, env, st, source, options, step, device, events,
                                                    program.order)
            pool = BufferPool(device, limit_bytes=pool_limit_bytes(plan.bucket_bytes))
            rec["pool"] = pool

            def executor(p, program=None):
                return Executor(p, groups, events, pool, tap=drills.corrupt, overlap=options.overlap,
                                program=program)

            ex, ex_plan = executor(plan, program), plan
            events.common["transport"] = plan.transport  # every event says which transport it belongs to
            for it in range(warmup + options.iterations):
                if it < warmup:  # events of warm-up (untimed) refits say so
                    events.common["warmup"] = True
                else:
                    events.common.pop("warmup", None)
                if time_limit is not None:  # every rank alike: one control all-reduce of the arrivals
                    time_limit.stop_before(groups, step, st.committed_step, _commit.gather_steps)
                if st.src is not None and step != st.src_step:
                    with events.phase("materialise", step=step):
                        advance_source(plan, st, source, step)
                attempt = 0
                while True:
                    with events.phase("attempt", step=step, attempt=attempt, transport=ex_plan.transport) as ph:
                        try:
                            report = refit_once(RefitContext(ex_plan, groups, ex, options, events, drills),
                                                st, source, step)
                            ph["outcome"] = "committed"
                        except (TransferError, RuntimeError) as exc:
                            ph["outcome"] = f"{type(exc).__name__}: {exc}"
                            failed = exc
                        else:
                            failed = None
                    if attempt or failed is not None:
                        rec["attempts"].append({"step": step, "attempt": attempt, "transport": ex_plan.transport,
                                                "outcome": ph["outcome"]})
                    if failed is None:
                        break
                    _retry_or_raise(failed, attempt, options, store, env, events, step)
                    attempt += 1
                    with events.phase("group_init", backend=env.backend, attempt=attempt):
                        groups = rebuild(groups, all_plans, store, timeout)
                    _connect(groups, all_plans, options, drills, events, step)
                    ex_plan = fallback if use_fallback else plan
                    events.common["transport"] = ex_plan.transport
                    ex = executor(ex_plan)
                if it >= warmup:
                    rec["iterations"].append(report)
                step += 1
            events.common.pop("warmup", None)
            rec["peak"] = pool.peak
            if options.baseline:
                with events.phase("baseline") as ph:
                    rec["baseline"] = raw_transfer(plan, groups)
                    ph.update(rec["baseline"])
            pool.clear()
            prev = plan
        failed_plan = None
        events.common.pop("transport", None)  # the agreement closes the session, not one transport
        with events.phase("agreement") as ph:  # every inference rank ends on the same committed step
            _, steps = _commit.gather_steps(groups, 1, st.committed_step)
            low, ahead = _commit.agree(steps, first.train_world)
            ph["steps"] = steps[first.train_world:]
            if ahead:
                raise TransferError(f"inference ranks end on different committed steps: {steps[first.train_world:]}")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        error = exc
    finally:
        try:
            _dump(options, env, first, st)
        finally:
            if error is None:
                shutdown()  # after a failure, pending ops of a dead peer could block a clean teardown
            events.close()
    record = None
    if error is not None:
        record = getattr(error, "record", None) or failure_record(env, "set-up" if groups is None else "session",
                                                                  options.first_step, error)
        record = {**record, "error": type(error).__name__}
    out: dict[str, RankReport] = {}
    blame = failed_plan if failed_plan is not None else names[-1]
    for k, name in enumerate(names):
        rec = per_plan[name]
        err = None
        if error is not None and name == blame:
            err = error
        elif error is not None and k > names.index(blame):
            err = TransferError(f"not run: plan {blame!r} failed first")
        out[name] = RankReport(
            global_rank=env.global_rank, side=env.side, side_rank=env.side_rank, ok=err is None,
            error_type=None if err is None else type(err).__name__,
            error_message=None if err is None else (err.message if isinstance(err, ReshardError) else str(err)),
            backend=env.backend, device=info.get("device", ""),
            rendezvous_s=info.get("rendezvous_s", 0.0), group_init_s=info.get("group_init_s", 0.0),
            materialise_s=rec["materialise_s"], iterations=tuple(rec["iterations"]),
            peak_staging_bytes=rec["pool"].peak if "pool" in rec else 0,
            staged_weight_bytes=st.staged.nbytes if st.staged is not None else 0,
            baseline=rec["baseline"], host=HOST, failure=record if err is not None else None,
            committed_step=st.committed_step if env.side == "infer" else None,
            attempts=tuple(rec["attempts"]), events_error=events.problem(),
        )
    return out


def report_dict(report: RankReport) -> dict:
    return dataclasses.asdict(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reshardctl.runtime.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--session", required=True,
                    help="a launcher's session file (runtime/session_file.py: plans, run options, warm-up)")
    a = ap.parse_args(argv)
    return _main_session(a.session)


def _threads_per_task() -> int:
    """CPU threads for this rank: Slurm's ``--cpus-per-task`` when given, else this task's CPUs shared by
    the tasks of its node (ranks on one node must not oversubscribe its cores)."""
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split(",")[0].split("(")[0]
    return max(1, cpus // max(1, int(per_node) if per_node.isdigit() else 1))


def _main_session(path: str) -> int:
    """One rank of a launcher's session (``reshardctl run --launcher slurm``): the plans, the fallback plan,
    options (token included) and warm-up from ``path``; the rank from the environment; ``{plan: report}``
    into ``<run_dir>/reports/rank-<N>.json``. Exit status 0 = every refit of every plan committed; 2 = the
    session file cannot be loaded (missing, untrusted, not a session file: nothing run)."""
    try:
        spec = read_session(path)
        first = next(iter(spec.plans.values()))
        parse_faults(spec.options.faults)
        env = read_rank_env(first.train_world, first.infer_world, force_cpu=spec.options.device == "cpu")
    except ReshardError as exc:
        print(f"reshardctl worker: {exc}", file=sys.stderr)
        return 2 if exc.exit_code == 2 else 1
    options = spec.options
    torch.set_num_threads(_threads_per_task())
    reports = run_rank_session(env, spec.plans, options, warmup=spec.warmup, fallback=spec.fallback,
                               time_limit=arm())
    run_dir = Path(options.run_dir)
    out = run_dir / "reports" / f"rank-{env.global_rank}.json"
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json_atomic(out, {n: report_dict(r) for n, r in reports.items()}, mode=0o600, indent=1, default=str)
    bad = [r for r in reports.values() if not r.ok]
    # rank 0 hosts the store; every rank stays until the others reported or are known gone (bounded)
    await_reports(run_dir, env.world_size, failed=bool(bad), timeout_s=options.timeout_s, retries=options.retries)
    for r in bad[:1]:
        print(f"reshardctl worker rank {env.global_rank}: {r.error_type}: {r.error_message}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    os.umask(0o077)  # every file this rank creates (events, report, weights) is private to its user
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown: after a failure, a dead peer's pending ops could hold it up
