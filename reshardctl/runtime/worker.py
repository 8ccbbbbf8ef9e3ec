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

from reshardctl.errors import ReshardError, TransferError
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


def _barrier(groups: Groups) -> None:
    probe = torch.ones(1, device=groups.device)
    try:
        dist.all_reduce(probe)
    except RuntimeError as exc:
        raise TransferError(f"rank {groups.env.global_rank}: common start failed (a rank is gone?): {exc}") from exc


def _advance_source(plan, st: _State, source, step: int) -> None:
    if isinstance(source, SyntheticWeights) and st.src_step is not None and st.src_step != step:
        for i, ts in st.src.data.items():
            for t in ts:
                restep_(plan.model.tensors[i], t, st.src_step, step)
    st.src_step = step


def _refit(plan, env: RankEnv, groups: Groups, ex: Executor, st: _State, source, options: RunOptions,
           faults: Faults, events: EventLog, step: int) -> IterationReport:
    _barrier(groups)
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
    events = EventLog(options.run_dir, env.global_rank, env.side, fingerprint=plan.fingerprint)
    faults = Faults(parse_faults(options.faults), env.global_rank)
    st = _State()
    info: dict = {"backend": env.backend}
    iterations: list[IterationReport] = []
    error: BaseException | None = None
    pool = None
    try:
        timeout = options.timeout_s
        with events.phase("rendezvous", peers=[env.master_addr, env.master_port]):
            t = time.perf_counter()
            store = rendezvous(env, options.rendezvous_timeout_s or timeout)
            info["rendezvous_s"] = time.perf_counter() - t
        with events.phase("group_init", backend=env.backend):
            t = time.perf_counter()
            groups = init_groups(env, plan, store, timeout)
            info["group_init_s"] = time.perf_counter() - t
        device = groups.device
        info["device"] = str(device)
        source = weight_source(plan.model, options.checkpoint)
        with events.phase("materialise", step=options.first_step) as ph:
            t = time.perf_counter()
            if env.side == "train":
                holdings = plan.src_holdings(env.side_rank)
                st.src = LocalWeights(plan.model, holdings, materialise(
                    plan.model, holdings, options.first_step, source=source, device=device))
                st.src_step = options.first_step
                ph["bytes"] = st.src.nbytes
            else:
                holdings = plan.dst_holdings(env.side_rank)
                if options.initial_weights == "synthetic":
                    cur = materialise(plan.model, holdings, options.first_step - 1,
                                      source=SyntheticWeights(plan.model), device=device)
                    st.committed_step = options.first_step - 1
                else:
                    cur = empty_like_holdings(plan.model, holdings, device=device)
                st.current = LocalWeights(plan.model, holdings, cur)
                st.staged = LocalWeights(plan.model, holdings, empty_like_holdings(plan.model, holdings, device=device))
                ph["bytes"] = st.staged.nbytes
            info["materialise_s"] = time.perf_counter() - t
        pool = BufferPool(device, limit_bytes=max(4 * plan.bucket_bytes, 64 << 20))
        ex = Executor(plan, groups, events, pool, faults, overlap=options.overlap)
        for it in range(options.iterations):
            step = options.first_step + it
            if st.src is not None and step != st.src_step:
                with events.phase("materialise", step=step):
                    _advance_source(plan, st, source, step)
            iterations.append(_refit(plan, env, groups, ex, st, source, options, faults, events, step))
        if options.baseline:
            with events.phase("baseline") as ph:
                info["baseline"] = raw_transfer(plan, groups)
                ph.update(info["baseline"])
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        error = exc
    finally:
        try:
            _dump(options, env, plan, st)
        finally:
            shutdown()
            events.close()
    return RankReport(
        global_rank=env.global_rank, side=env.side, side_rank=env.side_rank, ok=error is None,
        error_type=None if error is None else type(error).__name__,
        error_message=None if error is None else (error.message if isinstance(error, ReshardError) else f"{type(error).__name__}: {error}"),
        backend=env.backend, device=info.get("device", ""),
        rendezvous_s=info.get("rendezvous_s", 0.0), group_init_s=info.get("group_init_s", 0.0),
        materialise_s=info.get("materialise_s", 0.0), iterations=tuple(iterations),
        peak_staging_bytes=pool.peak if pool is not None else 0,
        staged_weight_bytes=st.staged.nbytes if st.staged is not None else 0,
        baseline=info.get("baseline", {}),
    )


def report_dict(report: RankReport) -> dict:
    return dataclasses.asdict(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reshardctl.runtime.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="pickled plan (StaticPlan.freeze(plan))")
    ap.add_argument("--run-dir", required=True)
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


if __name__ == "__main__":
    sys.exit(main())
