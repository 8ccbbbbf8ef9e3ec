"""What the runtime consumes and produces.

``ExecutablePlan`` is the planner's side of the contract (any object with these members will do; the
launchers ship the planner's own ``Plan``, runtime/session_file.py); ``StaticPlan`` is one written out
rank by rank (every rank's steps and holdings: hand-made plans, another tool's);
``RunOptions`` are the knobs of one run; ``RankReport`` is what one rank hands back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Protocol, Sequence, runtime_checkable

from reshardctl.layout.placement import Box
from reshardctl.models.spec import ModelSpec
from reshardctl.plan.schedule import BroadcastBucket, Step
from reshardctl.runtime.mirror import check_mirror
from reshardctl.topology import infer_rank_of, is_trainer

Holdings = Mapping[int, tuple[Box, ...]]  # tensor index -> boxes (in a fixed order)


@runtime_checkable
class ExecutablePlan(Protocol):
    model: ModelSpec
    train_world: int
    infer_world: int
    transport: str
    fingerprint: str
    bucket_bytes: int

    def steps_for(self, global_rank: int) -> list[Step]: ...

    def src_holdings(self, train_rank: int) -> Holdings: ...

    def dst_holdings(self, infer_rank: int) -> Holdings: ...

    def boxes_of(self, global_rank: int, tensor: int) -> tuple[Box, ...]: ...

    def broadcast_groups(self) -> list[tuple[int, ...]]: ...


@dataclass(frozen=True)
class StaticPlan:
    """Every rank's steps and holdings written out (hand-made plans, another tool's): picklable, no planner
    code needed to read it; checked whole when built (``check_mirror``)."""

    model: ModelSpec
    train_world: int
    infer_world: int
    transport: str
    fingerprint: str
    bucket_bytes: int
    steps: Mapping[int, tuple[Step, ...]]  # global rank -> steps (missing = no steps)
    src: Mapping[int, Holdings]  # train rank -> holdings
    dst: Mapping[int, Holdings]  # infer rank -> holdings

    def __post_init__(self) -> None:
        check_mirror(self.steps)

    @property
    def world_size(self) -> int:
        return self.train_world + self.infer_world

    def __reduce__(self):
        # ModelSpec keeps its config in a mappingproxy, which pickle refuses: ship its parts instead.
        m = self.model
        parts = (m.name, m.dims, m.tensors, m.source, dict(m.config))
        return (_rebuild_static, (parts, self.train_world, self.infer_world, self.transport, self.fingerprint,
                                  self.bucket_bytes, dict(self.steps), dict(self.src), dict(self.dst)))

    def steps_for(self, global_rank: int) -> list[Step]:
        return list(self.steps.get(global_rank, ()))

    def src_holdings(self, train_rank: int) -> Holdings:
        return self.src.get(train_rank, {})

    def dst_holdings(self, infer_rank: int) -> Holdings:
        return self.dst.get(infer_rank, {})

    def boxes_of(self, global_rank: int, tensor: int) -> tuple[Box, ...]:
        T = self.train_world
        held = self.src.get(global_rank, {}) if is_trainer(global_rank, T) else self.dst.get(infer_rank_of(global_rank, T), {})
        return tuple(held.get(tensor, ()))

    def broadcast_groups(self) -> list[tuple[int, ...]]:
        return sorted({tuple(sorted(s.group)) for steps in self.steps.values() for s in steps
                       if isinstance(s, BroadcastBucket)})


def _rebuild_static(parts, *rest) -> "StaticPlan":
    name, dims, tensors, source, config = parts
    return StaticPlan(ModelSpec(name, dims, tensors, source, config), *rest)


@dataclass(frozen=True)
class RunOptions:
    """Knobs of one run, identical on every rank."""

    run_dir: str | None = None  # events go to <run_dir>/events/rank-<N>.jsonl; None = no events
    iterations: int = 1
    first_step: int = 1  # training step of the first refit; inference starts on step first_step-1
    timeout_s: float = 60.0  # bound on every blocking communication call
    rendezvous_timeout_s: float | None = None  # default: timeout_s
    # "auto" (CUDA when available), "cpu", "cuda"; "cuda-gloo" (the local launcher): every rank's weights on
    # a CUDA device (one GPU may hold every rank), the bytes through gloo and host memory (host_staging.py)
    device: str = "auto"
    checkpoint: str | None = None  # safetensors file or directory; None = synthetic weights
    initial_weights: str = "synthetic"  # inference start weights: "synthetic" (step first_step-1) or "empty"
    full_check: bool = False  # compare every destination box to the weight source before commit
    overlap: bool = True  # pack/gather step k+1 while step k is in flight
    dump_weights: bool = False  # inference ranks torch.save their current weights at the end
    baseline: bool = False  # after the refits, time raw send/recv (and broadcasts) of the same byte volumes
    faults: str | None = None  # fault drills (drills.py), worker layer only
    retries: int = 0  # failed refits retried after every rank settled, on freshly built groups
    on_failure: str = "abort"  # "abort" | "fallback": retries use the session's fallback plan (gather-and-broadcast)
    token: str | None = None  # the run's token (else RESHARDCTL_RUN_TOKEN): ranks without it are refused


@dataclass(frozen=True)
class IterationReport:
    step: int
    committed: bool
    transfer_s: float  # from the common start (barrier) to this rank's last step finished
    verify_s: float
    commit_s: float
    full_check_s: float
    bytes_sent: int  # payload bytes (regions), without padding and trailers
    bytes_received: int
    wire_bytes: int  # bytes actually posted (sent + received), padding and trailers included
    transport: str = ""  # the transport of the plan this refit ran
    # the ledger entry that made ``transport`` the site's active one ({"line", "action", "time", "user",
    # "transport"}); None when the profile's default ruled or no ledger was consulted
    ledger_entry: Mapping | None = None


@dataclass(frozen=True)
class RankReport:
    global_rank: int
    side: str
    side_rank: int
    ok: bool
    error_type: str | None = None
    error_message: str | None = None
    backend: str = ""
    device: str = ""
    rendezvous_s: float = 0.0
    group_init_s: float = 0.0
    materialise_s: float = 0.0
    iterations: tuple[IterationReport, ...] = ()
    peak_staging_bytes: int = 0  # transient pack/receive/bucket buffers (high-water mark); zero-copy regions need none
    staged_weight_bytes: int = 0  # the second (staged) copy of the inference weights
    # the raw transfer of the same per-pair byte volumes (best of 3): seconds, p2p_s, broadcast_s,
    # bytes_sent, bytes_received (this rank's point-to-point bytes), broadcast_bytes, peers
    baseline: Mapping[str, float] = field(default_factory=dict)
    host: str = ""
    # when not ok: rank, host, side, phase, step, round, step_kind, peers, at (unix), knock_on
    failure: Mapping | None = None
    committed_step: int | None = None  # the training step this rank's inference weights hold at the end
    attempts: tuple = ()  # one dict per attempt of a refit that failed at least once (retries)
    events_error: str | None = None  # this rank's event log was refused by the disk: "<file>: <why> (<n> not written)"

    def raise_for_status(self) -> None:
        if not self.ok:
            from reshardctl.errors import TransferError, VerificationError

            cls = VerificationError if self.error_type == "VerificationError" else TransferError
            raise cls(f"rank {self.global_rank} ({self.side} {self.side_rank}): {self.error_message}")


def rank_report_from_dict(data: Mapping) -> RankReport:
    """A ``RankReport`` back from its JSON form (``dataclasses.asdict``), e.g. a Slurm rank's report file.
    Unknown keys are ignored (a newer rank), missing ones take their defaults."""
    names = {f.name for f in fields(RankReport)}
    it_names = {f.name for f in fields(IterationReport)}
    kw = {k: v for k, v in data.items() if k in names}
    kw["iterations"] = tuple(IterationReport(**{k: v for k, v in it.items() if k in it_names})
                             for it in data.get("iterations", ()))
    kw["baseline"] = dict(data.get("baseline") or {})
    return RankReport(**kw)


__all__: Sequence[str] = (
    "ExecutablePlan",
    "Holdings",
    "IterationReport",
    "RankReport",
    "RunOptions",
    "StaticPlan",
    "rank_report_from_dict",
)
