"""Python API for RL frameworks: plan once, then refit inside your own processes.

    import torch.distributed as dist
    from reshardctl import api

    plan = api.plan_refit(model="qwen3-30b-a3b", train="tp=4,ep=4", infer="tp=8", site="my-site.yaml")
    # every process of a default group laid out as trainer ranks 0..T-1, then inference ranks T..T+I-1:
    refitter = api.Refitter(plan)                 # collective: creates the broadcast sub-groups
    boxes = refitter.holdings()                   # {hf_name: (box, ...)} this rank holds
    report = refitter.refit(step, local_src=...)  # trainer ranks: {hf_name: [tensor per box]}
    report = refitter.refit(step, local_dst=...)  # inference ranks: updated in place, only once committed

Two worlds (trainer job and inference engines each with their own default world, or none), joined by
an update group built from a store address and the run's token (runtime/update_world.py):

    ug = api.UpdateGroup(address="10.0.0.1:29600", token=token, side="train", side_rank=rank)  # or "infer"
    refitter = api.Refitter(plan, update_group=ug, binding=binding, transport_source=ledger)
    report = refitter.refit(step)  # report.transport, report.ledger_entry

The same executor, checksums, two-phase commit and events as ``reshardctl run`` (reshardctl/runtime/).
On an inference rank ``local_dst`` is written only after EVERY rank verified its bytes and this rank
learned that every rank knows it; a failed refit raises ``VerificationError``/``TransferError`` and
leaves ``local_dst`` untouched. Reference: docs/api.md.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from datetime import timedelta
from itertools import chain
from typing import Mapping, Sequence

import torch
import torch.distributed as dist

from reshardctl.bind.binding import Binding, bind
from reshardctl.errors import BindingError, ReshardError, TransferError, VerificationError
from reshardctl.layout.placement import Box
from reshardctl.plan.planner import build_plan, plan_for
from reshardctl.plan.refit_plan import TRANSPORTS, Plan
from reshardctl.request.request import RefitRequest
from reshardctl.request.resolve import prepare
from reshardctl.runbook.transport_source import Decision, LedgerTransport
from reshardctl.runtime.contract import IterationReport, RunOptions
from reshardctl.runtime.device import data_plane_backend
from reshardctl.runtime.env import RankEnv
from reshardctl.runtime.events import EventLog
from reshardctl.runtime.executor import Executor
from reshardctl.runtime import nccl_watchdog
from reshardctl.runtime.groups import attach_groups, release, rendezvous
from reshardctl.runtime.preconnect import preconnect
from reshardctl.runtime.settle import settle
from reshardctl.runtime.transport_decision import DecisionChannel
from reshardctl.runtime.update_group import UpdateGroup, update_backend
from reshardctl.plan.gpu_memory import pool_limit_bytes
from reshardctl.runtime.buffer_pool import BufferPool
from reshardctl.runtime.local_weights import LocalWeights
from reshardctl.runtime.refit import RefitContext, State, refit_once
from reshardctl.runtime.run_store import CHECK_KEY, for_torch, scoped
from reshardctl.runtime import update_world
from reshardctl.topology import side_of_global

__all__ = ["plan_refit", "bind", "Binding", "Refitter", "UpdateGroup", "LedgerTransport", "Decision", "IterationReport",
           "ReshardError", "BindingError", "TransferError", "VerificationError"]

_instances = [0]  # Refitters created in this process (the same count on every rank: construction is collective)


def plan_refit(*, model, train: str | None = None, infer: str | None = None, site: str = "local",
               transport: str = "reshard", layers: int | None = None, train_style: str = "megatron",
               infer_style: str = "vllm", train_layout: str | None = None, infer_layout: str | None = None,
               bucket_mb: float | None = None, relay: str = "auto", mtp: bool = False) -> Plan:
    """Build a plan from the same inputs as ``reshardctl plan`` (the same ``RefitRequest``, validated the
    same way)."""
    request = RefitRequest(site=site, model=model, layers=layers, mtp=mtp, train=train, infer=infer,
                           train_style=train_style, infer_style=infer_style, train_layout=train_layout,
                           infer_layout=infer_layout, transport=transport, bucket_mb=bucket_mb, relay=relay)
    inp = prepare(request)
    return build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=transport,
                      bucket_bytes=inp.bucket_bytes, relay=inp.relay, broadcast_span=inp.broadcast_span)


class Refitter:
    """This process's part of every refit of ``plan``: on the initialised default process group
    (trainer ranks first), or with ``update_group`` in an update world of reshardctl's own that joins
    two worlds (docs/api.md, "Two worlds")."""

    def __init__(self, plan: Plan, *, binding=None, update_group: UpdateGroup | None = None,
                 transport_source=None, site: str | None = None, events_dir: str | None = None,
                 timeout_s: float = 300.0, unsafe_monitor: str = "refuse"):
        """``binding``: the framework's own parameters bound to the plan (reshardctl.bind: ``tensors()``
        is what ``refit`` moves, ``land_copies()`` runs after each commit on inference ranks);
        ``transport_source``: a callable returning a decision (``.transport``, ``.ledger_entry``,
        ``.note``; runbook.transport_source.LedgerTransport reads the site's ledger), asked by update
        rank 0 before each refit, its choice sent to every rank before any byte moves (every rank passes
        one, or none; only rank 0's is consulted). ``site``: the site profile (name or file) whose
        ledger decides: ``transport_source=LedgerTransport(site)``, so ``reshardctl rollback --site S``
        (or ``promote``) takes effect at the next refit. ``unsafe_monitor``: what to do when the framework's
        NCCL settings let torch's monitor kill this process after a failed refit
        (``nccl_watchdog.monitor_risk``): ``"refuse"`` (a ``TransferError``, before any group is built)
        or ``"warn"`` (a ``RuntimeWarning``, then go on)."""
        if unsafe_monitor not in ("refuse", "warn"):
            raise TransferError(f"unsafe_monitor={unsafe_monitor!r}: use 'refuse' or 'warn'")
        if site is not None:
            if transport_source is not None:
                raise TransferError("Refitter: give site= (the site's ledger decides) or transport_source=, not both")
            transport_source = LedgerTransport(site, warn=_said_by_refit)  # the Refitter warns of a note once
        T, I = plan.train_world, plan.infer_world
        if update_group is None:
            if not dist.is_initialized():
                raise TransferError("Refitter needs torch.distributed initialised (init_process_group) first, "
                                    "or an update_group (api.UpdateGroup) joining two worlds")
            world, rank = dist.get_world_size(), dist.get_rank()
            if world != T + I:
                raise TransferError(f"the default group has {world} ranks; the plan needs {T} trainer + {I} "
                                    f"inference = {T + I}")
            # "nccl", "gloo" or a composite "cpu:gloo,cuda:nccl": the data plane is NCCL when CUDA tensors go to NCCL
            backend = data_plane_backend(dist.get_backend())
            side, side_rank = side_of_global(rank, T)
            # the caller already rendezvoused: address and port are only recorded (from the usual variables)
            addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = int(os.environ.get("MASTER_PORT", "1") or 1)
        else:
            if update_world.INCOMPATIBLE is not None:
                raise TransferError(f"two worlds (UpdateGroup) cannot be joined with torch {torch.__version__}: "
                                    f"{update_world.INCOMPATIBLE}")
            world, rank = T + I, update_group.update_rank(T, I)
            side, side_rank = update_group.side, update_group.side_rank
            addr, port = update_group.host_port()
            backend = update_backend(update_group.backend, binding)
        check_monitor(backend, os.environ, unsafe_monitor)
        # the framework already chose this process's GPU (torch.cuda.set_device): it is used as it is
        local = torch.cuda.current_device() if backend == "nccl" else 0
        device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        self.plan, self.model, self.binding = plan, plan.model, binding
        self.env = RankEnv(rank, world, local, side, side_rank, addr, port, backend, source="api",
                           cuda_index=local if backend == "nccl" else None)
        self.options = RunOptions(run_dir=events_dir, timeout_s=timeout_s)
        self.device, self.timeout_s = device, timeout_s
        # one plan per transport this Refitter may run: the plan's own, and with a transport source every
        # transport it can name (their broadcast groups are all built now: groups are collective)
        self._plans = {plan.transport: plan}
        if transport_source is not None:
            for t in TRANSPORTS:
                self._plans.setdefault(t, plan_for(plan, t))
        self._decisions = (None if transport_source is None else
                           DecisionChannel(transport_source, self._plans, rank, timeout_s))
        self._run_store = self._world_name = None
        if update_group is not None:  # the update world's store, hosted by update rank 0; the token checked
            self._run_store = rendezvous(self.env, timeout_s, token=update_group.token)
            nonce = self._run_store.underlying_store.get(CHECK_KEY).decode(errors="replace").partition(":")[0]
            # torch registers groups by name in this process and prefixes their store keys with it: the
            # same on every rank of this update world, unique among this process's update worlds
            self._world_name = f"reshardctl-update-{nonce[:16]}"
        self.events = EventLog(events_dir, rank, side, fingerprint=plan.fingerprint)
        _instances[0] += 1
        self._uid = _instances[0]
        self._attempt = 0
        self.pool = BufferPool(device, limit_bytes=pool_limit_bytes(max(p.bucket_bytes for p in self._plans.values())))
        self._build()
        self._holdings = plan.src_holdings(side_rank) if side == "train" else plan.dst_holdings(side_rank)
        self._names = [self.model.tensors[i].name for i in self._holdings]
        self._bound: dict[str, tuple] = {}  # "local_src"/"local_dst": (key, checked weights, flat tensors)
        self._arena_flat: tuple | None = None  # (the arena's data dict, its views flat in holdings order)
        self._staged: LocalWeights | None = None
        self._committed: int | None = None
        self._broken = False

    def _store(self):
        """The store failures and settling go through: the update world's (sealed with the token's keys),
        or the caller's default store."""
        if self._run_store is not None:
            return scoped(self._run_store, "refitter/")
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            return dist.PrefixStore(f"reshardctl/refitter-{self._uid}/", _get_default_store())
        except Exception:  # noqa: BLE001 - no store: failures are not published, each rank runs into its own timeout
            return None

    def _build(self) -> None:
        """Own control and data groups (collective), so a failed refit can be followed by fresh ones: over
        the caller's default group, or in the update world."""
        new_group = None
        if self._run_store is not None:
            # kept on self: torch holds only the C++ side of the Python store it is given (run_store.for_torch)
            self._torch_store = for_torch(scoped(self._run_store, f"groups/attempt-{self._attempt}/"))
            world = update_world.UpdateWorld(
                self._torch_store, self.env.global_rank, self.env.world_size,
                f"{self._world_name}-a{self._attempt}", timedelta(seconds=self.timeout_s),
                self.device if self.device.type == "cuda" else None)
            new_group = world.new_group
        plans = list(self._plans.values())
        self.groups = attach_groups(self.env, plans, self.device, self.timeout_s, own_data=True,
                                    new_group=new_group)
        store = self._store()
        self.groups.store = None if store is None else scoped(store, f"attempt-{self._attempt}/")
        # every path of the refits connected now, bounded (preconnect.preconnect): the first refit, and the
        # first after a rebuild, do not meet a peer for the first time inside an unbounded post
        with self.events.phase("connect", attempt=self._attempt) as ph:
            ph.update(preconnect(self.groups, plans, self.timeout_s))
        self._executors: dict[str, Executor] = {}
        self.executor = self._executor(self.plan.transport)

    def _executor(self, transport: str) -> Executor:
        """The executor of ``transport``'s plan on the current groups (made at its first refit)."""
        ex = self._executors.get(transport)
        if ex is None:
            ex = self._executors[transport] = Executor(self._plans[transport], self.groups, self.events, self.pool)
        return ex

    def holdings(self) -> dict[str, tuple[Box, ...]]:
        """The boxes (global HF coordinates) this rank holds, by HF tensor name; one local tensor per box."""
        return {self.model.tensors[i].name: boxes for i, boxes in self._holdings.items()}

    def _local(self, tensors: Mapping[str, Sequence[torch.Tensor]], what: str) -> LocalWeights:
        """The caller's tensors as LocalWeights. Checked in full when they are new; when they are the
        same tensor objects at the same addresses as last time (a framework updating its parameters in
        place), the checked weights are reused: a few C-level passes over the tensors, no Python per
        tensor (docs/api.md, "Host work per refit")."""
        key = flat = None
        try:
            lists = list(map(tensors.__getitem__, self._names))
            flat = list(chain.from_iterable(lists))
            key = (list(map(len, lists)), list(map(id, flat)), list(map(torch.Tensor.data_ptr, flat)))
        except (KeyError, TypeError, AttributeError):  # a name missing, or not tensors: the full check says which
            pass
        got = self._bound.get(what)
        if key is not None and got is not None and got[0] == key:
            return got[1].alias()
        missing = [self.model.tensors[i].name for i in self._holdings if self.model.tensors[i].name not in tensors]
        if missing:
            raise TransferError(f"{what} lacks {len(missing)} tensor(s) this rank holds, e.g. {missing[:3]}")
        for i in self._holdings:
            t = self.model.tensors[i]
            for x in tensors[t.name]:
                if not isinstance(x, torch.Tensor):
                    raise TransferError(f"{what}[{t.name!r}] holds a {type(x).__name__}, expected tensors")
                if str(x.dtype).removeprefix("torch.") != t.dtype or not _on(x.device, self.groups.device):
                    raise TransferError(f"{what}[{t.name!r}]: {x.dtype} on {x.device}, expected torch.{t.dtype} "
                                        f"on {self.groups.device}")
        weights = LocalWeights(self.model, self._holdings,
                               {i: list(tensors[self.model.tensors[i].name]) for i in self._holdings})
        if got is not None:  # new tensors: views of the old ones must not keep them alive
            for ex in self._executors.values():
                ex.pieces.forget(got[1].data)
        self._bound[what] = (key, weights, flat)
        return weights.alias()

    def _commit_copy(self, new: LocalWeights) -> None:
        """The committed bytes (``new``: the arena's views) into the caller's tensors, one
        ``torch._foreach_copy_`` (on CUDA, fused multi-tensor kernels where both sides are dense)."""
        if self._arena_flat is None or self._arena_flat[0] is not new.data:
            self._arena_flat = (new.data, [v for i in self._holdings for v in new.data[i]])
        dst = self._bound["local_dst"][2]
        with torch.no_grad():  # the caller's tensors may be parameters that require grad
            torch._foreach_copy_(dst, self._arena_flat[1])

    def refit(self, step: int, *, local_src: Mapping[str, Sequence[torch.Tensor]] | None = None,
              local_dst: Mapping[str, Sequence[torch.Tensor]] | None = None, retries: int = 0,
              producer: "torch.cuda.Stream | torch.cuda.Event | None" = None) -> IterationReport:
        """One refit (collective over every rank). Trainer ranks pass ``local_src``, inference ranks
        ``local_dst``; tensors per HF name in the order of ``holdings()``, each of its box's shape.
        With a ``binding`` both default to its ``tensors()`` (the framework's parameters themselves).
        With a ``transport_source`` update rank 0's choice is made and sent to every rank first; the
        report says which transport ran and the ledger entry it came from.
        A failed attempt is retried up to ``retries`` times (every rank passes the same value), after
        every rank settled, on fresh groups; the error of the last attempt is raised. After a failure the
        Refitter stays usable: the next call rebuilds its groups first.

        Streams (CUDA; docs/api.md "Streams"): the refit reads ``local_src`` (and writes ``local_dst``)
        after everything enqueued on the current stream. Weights written on another stream (an
        overlapped all-gather) must be ordered before the call: pass that stream, or an event recorded
        after its last write, as ``producer`` and the current stream waits for it first. On return the
        committed bytes are in ``local_dst`` and the current stream synchronized with the host: any
        consumer stream may read them."""
        if producer is not None and self.device.type == "cuda":
            current = torch.cuda.current_stream(self.device)
            if isinstance(producer, torch.cuda.Event):
                current.wait_event(producer)
            elif isinstance(producer, torch.cuda.Stream):
                current.wait_stream(producer)
            else:
                raise TransferError(f"producer must be a torch.cuda.Stream or torch.cuda.Event, got {type(producer).__name__}")
        if self.binding is not None:
            if self.env.side == "train" and local_src is None:
                local_src = self.binding.tensors()
            elif self.env.side == "infer" and local_dst is None:
                local_dst = self.binding.tensors()
        for attempt in range(retries + 1):
            if self._broken:
                self._rebuild(step)
            try:
                transport, entry = self._decide(step)
                report = self._refit_once(step, local_src, local_dst, transport)
                return dataclasses.replace(report, ledger_entry=entry)
            except TransferError as exc:
                self._broken = True
                self.events.record("attempt", 0.0, 0.0, error=exc, step=step, attempt=attempt)
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")

    def _rebuild(self, step: int) -> None:
        store = self._store()
        if store is not None:
            missing = settle(store, self.env, self._attempt, self.timeout_s)
            if missing:
                raise TransferError(f"refit of step {step}: rank(s) {missing} did not settle after the failed "
                                    f"refit within {self.timeout_s:g} s; the Refitter cannot rebuild its groups")
        # every rank left the failed attempt: its groups go (NCCL: aborted, never finalized), with torch's
        # dump signal of the failure (nccl_watchdog.py); then fresh ones
        release(self.groups)
        if store is not None:
            nccl_watchdog.clear_dump_signal(store)
        self._attempt += 1
        self._build()
        self._broken = False

    def _decide(self, step: int) -> tuple[str, dict | None]:
        """The transport of this refit and the ledger entry it came from: without a transport source the
        plan's own; with one, update rank 0 asks its source and sends (transport, entry) to every rank
        over the control group (one bounded broadcast), so both sides always run the same plan. A
        source that fails, or names a transport this Refitter has no plan for, fails the refit on every
        rank before any byte moves."""
        with self.events.phase("decide", step=step) as ph:
            if self._decisions is None:
                transport, entry = self.plan.transport, None
            else:
                transport, entry = self._decisions.receive(step, self.groups)
            ph.update(transport=transport, ledger_entry=entry)
        return transport, entry

    def _refit_once(self, step, local_src, local_dst, transport: str) -> IterationReport:
        st = State(committed_step=self._committed)
        local_error: ReshardError | None = None
        try:
            if self.env.side == "train":
                if local_src is None:
                    raise TransferError(f"trainer rank {self.env.side_rank}: refit needs local_src")
                st.src = self._local(local_src, "local_src")
            else:
                if local_dst is None:
                    raise TransferError(f"inference rank {self.env.side_rank}: refit needs local_dst")
                st.current = self._local(local_dst, "local_dst")
                if self._staged is None:  # the receive side's own arena: messages land in place
                    self._staged = LocalWeights.in_arena(self.model, self._holdings, self.groups.device,
                                                         order=self.executor.program.order)
                st.staged = self._staged
        except ReshardError as exc:
            # still take part: the readiness vote at the common start makes every rank raise at once
            local_error, st = exc, State(committed_step=self._committed)
        ctx = RefitContext(self._plans[transport], self.groups, self._executor(transport), self.options,
                           self.events)
        try:
            report = refit_once(ctx, st, None, step, not_ready=None if local_error is None else local_error.message)
        except TransferError:
            if st.current is not None and st.committed_step == step:  # every rank voted OK: the commit
                self._adopt(st, step)  # stands on every surviving rank (docs/commit-protocol.md), here too
            raise
        self._adopt(st, step)
        return report

    def _adopt(self, st: State, step: int) -> None:
        """The refit of ``step`` committed on this rank: only now the caller's tensors change."""
        if st.current is not None:
            # refit_once swapped: st.current holds the new bytes, st.staged the caller's tensors.
            self._commit_copy(st.current)
            if self.binding is not None:  # duplicate copies inside the rank (an EPLB redundant slot)
                self.binding.land_copies()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # written before it is reported done
            self._staged = st.current  # the arena with the new bytes: the next refit's staging copy
        self._committed = step

    def close(self) -> None:
        """Events flushed, buffers freed; in an update world its groups released (only reshardctl's: the
        caller's default group is never touched) and the store dropped (update rank 0 stops hosting it)."""
        self.events.close()
        self.pool.clear()
        if self._run_store is not None and self.groups is not None:
            release(self.groups)
            self.groups = self._run_store = self._torch_store = None
            self._executors.clear()
            self.executor = None


def _said_by_refit(note: str) -> None:
    """A ``LedgerTransport`` problem under a Refitter: the Refitter warns of the decision's note once."""


def check_monitor(backend: str, environ: Mapping[str, str], unsafe_monitor: str = "refuse") -> None:
    """On an NCCL data plane: refuse (``TransferError``) or warn (``RuntimeWarning``) when the framework's
    settings let torch's monitor kill this process after a failed refit (nccl_watchdog.monitor_risk). The
    variables are read from the environment now: torch read them when the framework created its default
    group, so this is right when the framework set them before ``init_process_group`` (as it should)."""
    risk = nccl_watchdog.monitor_risk(environ) if backend == "nccl" else None
    if risk is None:
        return
    advice = (f"set {nccl_watchdog.DUMP_ON_TIMEOUT}=0 (or {nccl_watchdog.ENABLE_MONITORING}=0) in every rank's "
              f"environment before init_process_group (docs/gpu.md, \"Torch's monitor\")")
    if unsafe_monitor == "refuse":
        raise TransferError(f"Refitter refused: {risk}", hint=advice + "; or Refitter(..., unsafe_monitor='warn')")
    warnings.warn(f"reshardctl: {risk}; {advice}", RuntimeWarning, stacklevel=3)


def _on(where: torch.device, device: torch.device) -> bool:
    """A tensor on ``where`` is on the rank's ``device``: the same type, and on CUDA the same index (a
    tensor on another GPU would be read by this GPU's streams with no order against its own)."""
    if where.type != device.type:
        return False
    return device.type != "cuda" or device.index is None or where.index == device.index
