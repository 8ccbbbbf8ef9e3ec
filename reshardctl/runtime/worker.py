"""One rank of a refit run: rendezvous -> groups -> materialise -> per refit: execute -> verify -> commit.

``run_rank(env, plan, options)`` is the core (a launcher calls it in-process); it never raises for a
failed refit: the returned ``RankReport`` says ``ok=False`` with the error (``raise_for_status``).
Module entry (one process per rank, rank read from the environment, see ``env.py``)::

    python -m reshardctl.runtime.worker --plan PLAN.pkl --run-dir DIR [--iterations N] ...

The plan file is a pickled plan object (``StaticPlan.freeze(plan)`` is always picklable); the report
goes to ``<run_dir>/reports/rank-<N>.json``. Exit status 0 = this rank's refits all committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from reshardctl.atomic_write import write_json_atomic
from reshardctl.errors import LaunchError, ReshardError, TransferError
from reshardctl.runtime import commit as _commit
from reshardctl.runtime.baseline import raw_transfer
from reshardctl.runtime.contract import IterationReport, RankReport, RunOptions
from reshardctl.runtime.env import RankEnv, read_rank_env
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.executor import Executor
from reshardctl.runtime.faults import Faults, parse_faults
from reshardctl.runtime.groups import Groups, init_groups, rendezvous, shutdown
from reshardctl.runtime.pack import BufferPool, LocalWeights
from reshardctl.runtime.weights import (
    SyntheticWeights,
    empty_like_holdings,
    materialise,
    restep_,
    weight_source,
)


@dataclasses.dataclass
class _State:
    src: LocalWeights | None = None
    current: LocalWeights | None = None
    staged: LocalWeights | None = None
    src_step: int | None = None
    committed_step: int | None = None


def _barrier(groups: Groups, not_ready: str | None = None, step: int | None = None) -> None:
    """The common start of a refit, and a readiness vote: when any rank is not ready (``not_ready`` says
    why), every rank raises here, before any byte moves, instead of waiting for it until a timeout."""
    env = groups.env
    ready = torch.ones(env.world_size, device=groups.device)
    if not_ready is not None:
        ready[env.global_rank] = 0
    try:
        dist.all_reduce(ready, op=dist.ReduceOp.MIN)
    except RuntimeError as exc:
        raise TransferError(f"rank {env.global_rank}: common start failed (a rank is gone?): {exc}") from exc
    missing = [r for r, x in enumerate(ready.cpu().tolist()) if x == 0]
    if missing:
        here = f"; here: {not_ready}" if not_ready else ""
        raise TransferError(f"refit of step {step} not started (nothing moved, nothing committed): "
                            f"rank(s) {missing} not ready{here}")


def _advance_source(plan, st: _State, source, step: int) -> None:
    if isinstance(source, SyntheticWeights) and st.src_step is not None and st.src_step != step:
        for i, ts in st.src.data.items():
            for t in ts:
                restep_(plan.model.tensors[i], t, st.src_step, step)
    st.src_step = step


def refit_once(plan, env: RankEnv, groups: Groups, ex: Executor, st: _State, source, options: RunOptions,
               faults: Faults, events: EventLog, step: int, not_ready: str | None = None) -> IterationReport:
    """One refit of this rank: common start, execute, verify, vote, commit (swap staged <-> current).
    Raises ``VerificationError``/``TransferError`` (nothing committed) unless every rank voted OK."""
    _barrier(groups, not_ready, step)
    faults.at_step_start(step)
    t0 = time.perf_counter()
    local_error: BaseException | None = None
    stats = None
    if st.staged is not None:
        st.staged.reset_coverage()
    try:
        stats = ex.run(step, st.src, st.staged)
    except Exception as exc:  # noqa: BLE001 - every failure becomes this rank's vote
        local_error = exc
    transfer_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    full_s = 0.0
    with events.phase("verify", step=step) as ph:
        problems: list[str] = []
        try:
            ex.exchange_checksums(failed=local_error is not None)
        except Exception as exc:  # noqa: BLE001 - a peer is gone: this rank's vote says FAILED
            if local_error is None:
                local_error = exc
        if local_error is None:
            problems = ex.checksum_failures()
            if st.staged is not None:
                problems += st.staged.coverage_problems()
                if options.full_check and not problems:
                    tf = time.perf_counter()
                    with events.phase("verify/full", step=step):
                        problems += _commit.full_check(st.staged, source, step)
                    full_s = time.perf_counter() - tf
        code = _commit.FAILED if local_error is not None else (_commit.BAD_DATA if problems else _commit.OK)
        ph["verdict"] = code
        if problems:
            ph["problems"] = problems[:5]
        try:
            codes = _commit.vote(groups, code)
        except TransferError as exc:
            if local_error is not None:
                raise TransferError(f"{local_error}; then {exc}") from local_error
            raise
    verify_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    with events.phase("commit", step=step) as ph:
        _commit.decide(codes, groups, plan.train_world, step, problems, local_error)
        if st.current is not None:
            st.current.swap_data(st.staged)
        st.committed_step = step
        ph["committed"] = True
    return IterationReport(
        step=step, committed=True, transfer_s=transfer_s, verify_s=verify_s,
        commit_s=time.perf_counter() - t2, full_check_s=full_s,
        bytes_sent=stats.bytes_sent, bytes_received=stats.bytes_received, wire_bytes=stats.wire_bytes,
    )


def _dump(options: RunOptions, env: RankEnv, plan, st: _State) -> None:
    if not (options.dump_weights and options.run_dir and st.current is not None):
        return
    path = Path(options.run_dir) / "weights" / f"rank-{env.global_rank}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "step": st.committed_step,
            "holdings": dict(st.current.boxes),
            "tensors": {i: [t.cpu() for t in ts] for i, ts in st.current.data.items()},
        },
        path,
    )


def run_rank(env: RankEnv, plan, options: RunOptions) -> RankReport:
    """Run this rank's part of ``options.iterations`` refits of ``plan``; never raises for a failed refit."""
    return run_session(env, {"plan": plan}, options, warmup=0)["plan"]


def _same_layout(a, b, side: str, rank: int) -> bool:
    if a is None or a.model.tensors != b.model.tensors:
        return False
    if side == "train":
        return dict(a.src_holdings(rank)) == dict(b.src_holdings(rank))
    return dict(a.dst_holdings(rank)) == dict(b.dst_holdings(rank))


def _prepare_weights(prev, plan, env: RankEnv, st: _State, source, options: RunOptions, step: int,
                     device, events: EventLog) -> float:
    """Weights for ``plan``'s refits starting at ``step``: carried over from the previous plan of the
    session when this rank's holdings are the same, materialised otherwise. Returns the seconds spent."""
    if _same_layout(prev, plan, env.side, env.side_rank):
        return 0.0
    with events.phase("materialise", step=step) as ph:
        t = time.perf_counter()
        if env.side == "train":
            holdings = plan.src_holdings(env.side_rank)
            st.src = None
            st.src = LocalWeights(plan.model, holdings, materialise(
                plan.model, holdings, step, source=source, device=device))
            st.src_step = step
            ph["bytes"] = st.src.nbytes
        else:
            holdings = plan.dst_holdings(env.side_rank)
            st.current = st.staged = None
            if st.committed_step is not None or options.initial_weights == "synthetic":
                at = st.committed_step if st.committed_step is not None else step - 1
                cur = materialise(plan.model, holdings, at, source=SyntheticWeights(plan.model), device=device)
                st.committed_step = at
            else:
                cur = empty_like_holdings(plan.model, holdings, device=device)
            st.current = LocalWeights(plan.model, holdings, cur)
            st.staged = LocalWeights(plan.model, holdings, empty_like_holdings(plan.model, holdings, device=device))
            ph["bytes"] = st.staged.nbytes
        return time.perf_counter() - t


def run_session(env: RankEnv, plans, options: RunOptions, *, warmup: int = 0) -> dict[str, RankReport]:
    """One rendezvous and one process group for several plans (same worlds), run in order: per plan
    ``warmup`` untimed refits, then ``options.iterations`` timed ones (every refit committed, the training
    step advancing by one each time, inference weights carried from plan to plan), then, with
    ``options.baseline``, the raw transfer of the same bytes. Never raises for a failed refit: the failing
    plan's report (and every later plan's) says ``ok=False``."""
    names = list(plans)
    if not names:
        raise TransferError("run_session needs at least one plan")
    first = plans[names[0]]
    for n in names[1:]:
        q = plans[n]
        if (q.train_world, q.infer_world) != (first.train_world, first.infer_world):
            raise LaunchError(f"plan {n!r} is {q.train_world}->{q.infer_world} ranks but {names[0]!r} is "
                              f"{first.train_world}->{first.infer_world}: a session shares one set of processes")
    events = EventLog(options.run_dir, env.global_rank, env.side, fingerprint=first.fingerprint)
    faults = Faults(parse_faults(options.faults), env.global_rank)
    st = _State()
    info: dict = {"backend": env.backend}
    per_plan: dict[str, dict] = {n: {"iterations": [], "baseline": {}, "peak": 0, "materialise_s": 0.0}
                                 for n in names}
    error: BaseException | None = None
    failed_plan: str | None = names[0]
    try:
        timeout = options.timeout_s
        with events.phase("rendezvous", peers=[env.master_addr, env.master_port]):
            t = time.perf_counter()
            store = rendezvous(env, options.rendezvous_timeout_s or timeout)
            info["rendezvous_s"] = time.perf_counter() - t
        with events.phase("group_init", backend=env.backend):
            t = time.perf_counter()
            groups = init_groups(env, [plans[n] for n in names], store, timeout)
            info["group_init_s"] = time.perf_counter() - t
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
                    _advance_source(plan, st, source, step)
            rec["materialise_s"] = _prepare_weights(prev, plan, env, st, source, options, step, device, events)
            pool = BufferPool(device, limit_bytes=max(4 * plan.bucket_bytes, 64 << 20))
            rec["pool"] = pool
            ex = Executor(plan, groups, events, pool, faults, overlap=options.overlap,
                          direct_min=options.direct_min_bytes)
            for it in range(warmup + options.iterations):
                if st.src is not None and step != st.src_step:
                    with events.phase("materialise", step=step):
                        _advance_source(plan, st, source, step)
                report = refit_once(plan, env, groups, ex, st, source, options, faults, events, step)
                if it >= warmup:
                    rec["iterations"].append(report)
                step += 1
            rec["peak"] = pool.peak
            if options.baseline:
                with events.phase("baseline") as ph:
                    rec["baseline"] = raw_transfer(plan, groups)
                    ph.update(rec["baseline"])
            pool.clear()
            prev = plan
        failed_plan = None
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        error = exc
    finally:
        try:
            _dump(options, env, first, st)
        finally:
            shutdown()
            events.close()
    out: dict[str, RankReport] = {}
    bad = False
    for name in names:
        rec = per_plan[name]
        err = None
        if error is not None and (name == failed_plan or bad):
            err = error if name == failed_plan else TransferError(f"not run: plan {failed_plan!r} failed first")
            bad = True
        plan = plans[name]
        out[name] = RankReport(
            global_rank=env.global_rank, side=env.side, side_rank=env.side_rank, ok=err is None,
            error_type=None if err is None else type(err).__name__,
            error_message=None if err is None else (err.message if isinstance(err, ReshardError) else str(err)),
            backend=env.backend, device=info.get("device", ""),
            rendezvous_s=info.get("rendezvous_s", 0.0), group_init_s=info.get("group_init_s", 0.0),
            materialise_s=rec["materialise_s"], iterations=tuple(rec["iterations"]),
            peak_staging_bytes=rec["pool"].peak if "pool" in rec else 0,
            staged_weight_bytes=st.staged.nbytes if st.staged is not None else 0,
            baseline=rec["baseline"],
        )
    return out


def report_dict(report: RankReport) -> dict:
    return dataclasses.asdict(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reshardctl.runtime.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--session", default=None,
                    help="a launcher's session file (pickle of plans, run options, warm-up; run_dir from the options)")
    ap.add_argument("--plan", default=None, help="pickled plan (StaticPlan.freeze(plan))")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--first-step", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--rendezvous-timeout-s", type=float, default=None)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--initial-weights", choices=("synthetic", "empty"), default="synthetic")
    ap.add_argument("--full-check", action="store_true")
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--dump-weights", action="store_true")
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--faults", default=None)
    a = ap.parse_args(argv)
    if a.session is not None:
        return _main_session(a.session)
    if a.plan is None or a.run_dir is None:
        ap.error("give --session FILE, or --plan FILE and --run-dir DIR")
    with open(a.plan, "rb") as fh:
        plan = pickle.load(fh)
    options = RunOptions(
        run_dir=a.run_dir, iterations=a.iterations, first_step=a.first_step, timeout_s=a.timeout_s,
        rendezvous_timeout_s=a.rendezvous_timeout_s, device=a.device, checkpoint=a.checkpoint,
        initial_weights=a.initial_weights, full_check=a.full_check, overlap=not a.no_overlap,
        dump_weights=a.dump_weights, baseline=a.baseline, faults=a.faults,
    )
    try:
        env = read_rank_env(plan.train_world, plan.infer_world, force_cpu=a.device == "cpu")
        if a.device == "cuda" and env.backend != "nccl":
            raise TransferError("--device cuda but no CUDA device is available")
    except ReshardError as exc:
        print(f"reshardctl worker: {exc}", file=sys.stderr)
        return 2 if exc.exit_code == 2 else 1
    report = run_rank(env, plan, options)
    out = Path(a.run_dir) / "reports" / f"rank-{env.global_rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report_dict(report), indent=1, default=str))
    if not report.ok:
        print(f"reshardctl worker rank {env.global_rank}: {report.error_type}: {report.error_message}", file=sys.stderr)
    return 0 if report.ok else 1


def _threads_per_task() -> int:
    """CPU threads for this rank: Slurm's ``--cpus-per-task`` when given, else this task's CPUs shared by
    the tasks of its node (ranks on one node must not oversubscribe its cores)."""
    import os

    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split(",")[0].split("(")[0]
    return max(1, cpus // max(1, int(per_node) if per_node.isdigit() else 1))


def _main_session(path: str) -> int:
    """One rank of a launcher's session (``reshardctl run --launcher slurm``): the plans, options and
    warm-up from ``path``; the rank from the environment; ``{plan: report}`` into
    ``<run_dir>/reports/rank-<N>.json``. Exit status 0 = every refit of every plan committed."""
    try:
        with open(path, "rb") as fh:
            spec = pickle.load(fh)
        plans, options, warmup = spec["plans"], spec["options"], spec["warmup"]
        first = next(iter(plans.values()))
        env = read_rank_env(first.train_world, first.infer_world, force_cpu=options.device == "cpu")
    except (OSError, pickle.UnpicklingError, KeyError, StopIteration) as exc:
        print(f"reshardctl worker: cannot read the session file {path}: {exc}", file=sys.stderr)
        return 2
    except ReshardError as exc:
        print(f"reshardctl worker: {exc}", file=sys.stderr)
        return 2 if exc.exit_code == 2 else 1
    torch.set_num_threads(_threads_per_task())
    reports = run_session(env, plans, options, warmup=warmup)
    out = Path(options.run_dir) / "reports" / f"rank-{env.global_rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, {n: report_dict(r) for n, r in reports.items()}, indent=1, default=str)
    bad = [r for r in reports.values() if not r.ok]
    for r in bad[:1]:
        print(f"reshardctl worker rank {env.global_rank}: {r.error_type}: {r.error_message}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
