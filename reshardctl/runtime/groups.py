"""Rendezvous and process groups: a gloo control plane apart from the data plane, every call bounded.

* Rendezvous: a ``TCPStore`` hosted by global rank 0 at ``master_addr:master_port``, listening on that
  address only (not every interface: the socket is bound here, ``run_store.listen_fd``); the others
  connect as clients within the rendezvous timeout. Every run has a random token
  (``RESHARDCTL_RUN_TOKEN`` or ``RunOptions.token``) from which the key prefix and the keys are derived
  by HMAC, never stored (``run_store.RunKeys``): rank 0 stores a nonce and its HMAC; a process whose
  token gives another (a stale rank, another run on the same port) is refused there (``LaunchError``).
  The records ranks act on, the failure record and the settle marks, are sealed (an HMAC over name and
  value, ``run_store.seal``); one with a wrong seal, written without the token, is ignored: it neither
  stops the run nor counts as a settled rank (docs/runs.md, "The run's store"). torch's own records
  (the groups' set-up: gloo addresses, NCCL ids) go through ``run_store.for_torch``: opaque names,
  sealed values, a wrong seal refused (the group creation fails, naming it).
* The data plane: the default group (gloo on CPU tensors, or NCCL on ``RankEnv.device`` (device.py's choice) with
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``: a timed-out or failed communicator is aborted, the process is
  not killed, so the rank still reports and votes), plus one sub-group per distinct broadcast group of
  the session's plans, created by ALL ranks in the same (sorted) order since ``new_group`` is collective.
* The control plane: one gloo group over every rank, with the run's timeout: the common start, the
  checksum exchange, the vote and the decision (refit.py); its all-reduces are binomial trees of
  point-to-point messages (``tree_all_reduce``: ``2 ceil(log2 n)`` steps, where gloo's ring takes
  ``2 (n - 1)``). Every wait is bounded (``wait_works``): gloo raises on a dead or silent peer within
  the timeout; on NCCL the host blocks in an event while a helper thread holds the deadline
  (``deadline_watch.py``) and aborts past it; and a rank stops waiting as soon as another rank
  published a failure of the attempt in the store.
* Attempts: ``rebuild`` tears every group down and builds fresh ones under a new store prefix
  (``attempt-<k>``), after every rank settled (``settle``), so nothing left posted by a failed attempt
  can match the next one's messages. On CUDA every failed refit leaves through ``abort_after_failure``
  (reshardctl's communicators aborted at once); ``release`` (in ``rebuild``) aborts NCCL groups and
  destroys gloo ones, never finalizing an NCCL communicator after a failure.
* First contact: ``preconnect`` connects every point-to-point direction and broadcast group the
  program uses right after the groups are built, under the deadline (NCCL connects lazily inside the
  post, outside every bound). Torch's NCCL monitor is kept from killing the process for reshardctl's
  groups by ``nccl_watchdog.py`` (docs/gpu.md, "Failures on NCCL").
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from reshardctl.errors import LaunchError, TransferError
from reshardctl.plan.schedule import BroadcastBucket, P2PRound
from reshardctl.runtime import nccl_watchdog
from reshardctl.runtime.deadline_watch import DeadlineWatch
from reshardctl.runtime.env import RankEnv
from reshardctl.runtime.run_store import (
    CHECK_KEY, RunKeys, RunStore, answers, challenge, for_torch, listen_fd, read_sealed, scoped, seal, unseal,
)

TOKEN_ENV = "RESHARDCTL_RUN_TOKEN"


@dataclass
class Groups:
    env: RankEnv
    device: torch.device
    timeout: timedelta
    ctrl: object = None  # gloo group over every rank (control plane)
    data: object = None  # the data plane group (the default group here; the API's own group there)
    broadcast: dict[tuple[int, ...], object] = field(default_factory=dict)  # members -> group (members only)
    attempt: int = 0
    store: object = None  # this attempt's store: failures are published there (None: not published)
    forged: bool = False  # a failure record with a wrong seal was seen (and ignored)
    aborted: bool = False  # reshardctl's NCCL communicators of this attempt were aborted (abort_data_plane)
    notes: list[str] = field(default_factory=list)  # settings overridden for torch's monitor (nccl_watchdog)

    def publish_failure(self, record: str) -> None:
        """Tell every rank that this attempt failed (first writer wins, the record sealed with the run's
        key: ``run_store.seal``); best effort (rank 0's store may be gone with rank 0). A record with a
        wrong seal in the slot (a process without the token wrote it) is overwritten."""
        if self.store is None:
            return
        try:
            sealed = seal(self.store, "failed", record)
            got = self.store.compare_set("failed", "", sealed)
            if got != sealed.encode() and self._believed(got) is None:
                self.store.set("failed", sealed)
        except Exception:  # noqa: BLE001 - the store went with rank 0: the peers see the dead rank anyway
            pass

    def failure(self) -> str | None:
        """The failure another rank published for this attempt, if any. A record whose seal is wrong is
        ignored (said once on stderr): only a rank with the run's token can stop the run this way."""
        if self.store is None:
            return None
        try:
            if not self.store.check(["failed"]):
                return None
            raw = self.store.get("failed")
        except Exception as exc:  # noqa: BLE001 - the store is unreachable: rank 0 is gone
            return f"the run's store is unreachable (rank 0 gone?): {exc}"
        return self._believed(raw)

    def _believed(self, raw: bytes) -> str | None:
        rec = unseal(self.store, "failed", raw)
        if rec is None and not self.forged:
            self.forged = True
            print(f"reshardctl rank {self.env.global_rank}: ignored a failure record with a wrong seal in the "
                  f"run's store (attempt {self.attempt}): written by a process without the run's token",
                  file=sys.stderr, flush=True)
        return rec

    def group_for(self, members: tuple[int, ...]):
        if self.env.global_rank not in members:
            raise TransferError(f"rank {self.env.global_rank} is not in broadcast group {members}")
        return self.broadcast[tuple(sorted(members))]


def rendezvous(env: RankEnv, timeout_s: float, token: str | None = None):
    """Connect to (or host) the run's store and check the run token; returns the run's own store
    (``run_store.RunStore``: the token-derived namespace, carrying the keys that seal its records).
    Rank 0 listens on ``env.master_addr`` only (``run_store.listen_fd``)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    keys = RunKeys.from_token(token)
    where = f"{env.master_addr}:{env.master_port}"
    host = env.global_rank == 0
    try:
        fd = listen_fd(env.master_addr, env.master_port) if host else None
    except OSError as exc:
        raise LaunchError(
            f"rank 0: cannot listen on the rendezvous address {where}: {exc.strerror or exc}",
            hint="the address must be one of rank 0's own (the launcher's master_addr) and the port free",
        ) from exc
    try:
        store = dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, is_master=host,
            timeout=timedelta(seconds=timeout_s), wait_for_workers=False, master_listen_fd=fd,
        )
        if host:
            store.set(CHECK_KEY, challenge(keys))
        elif not answers(keys, store.get(CHECK_KEY)):
            raise LaunchError(
                f"rank {env.global_rank}: refused at rendezvous {where}: this process's run token does not "
                f"match the run's",
                hint="a stale rank of an earlier run, or another run on the same port; each run has its own token",
            )
    except (RuntimeError, OSError) as exc:
        raise LaunchError(
            f"rank {env.global_rank}: rendezvous at {where} failed: {exc}",
            hint="is rank 0 running and the port free and reachable?",
        ) from exc
    return RunStore.make(keys.prefix, store, keys)


def broadcast_groups(plan) -> list[tuple[int, ...]]:
    """Every distinct broadcast group of a plan, or of a list of plans (sorted members), in a fixed
    order: from the plan itself (``plan.broadcast_groups()``: its buckets), not from walking every
    rank's steps, so every rank creates the same sub-communicators in O(buckets)."""
    found: set[tuple[int, ...]] = set()
    for pl in plan if isinstance(plan, (list, tuple)) else [plan]:
        found.update(pl.broadcast_groups())
    return sorted(found)


def _device(env: RankEnv) -> torch.device:
    """The data plane's device: ``RankEnv.device`` (device.py's choice on NCCL, made current here)."""
    device = torch.device(env.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init_groups(env: RankEnv, plan, store, timeout_s: float, attempt: int = 0) -> Groups:
    """``plan``: one plan or a list of plans (a session): the broadcast groups of all are created now."""
    device = _device(env)
    timeout = timedelta(seconds=timeout_s)
    notes: list[str] = []
    sealed = dist.PrefixStore(f"attempt-{attempt}/", for_torch(store))  # torch's records sealed (run_store.py)
    try:
        if env.backend == "nccl":  # the default group is ours: its errors abort it, not the process
            notes = nccl_watchdog.apply_own_rank_settings()  # before it exists: torch reads them then
            with nccl_error_handling(keep_users=True):
                dist.init_process_group(env.backend, store=sealed,
                                        rank=env.global_rank, world_size=env.world_size, timeout=timeout,
                                        device_id=device)
        else:
            dist.init_process_group(env.backend, store=sealed,
                                    rank=env.global_rank, world_size=env.world_size, timeout=timeout)
    except RuntimeError as exc:
        raise TransferError(f"rank {env.global_rank}: process group init ({env.backend}) failed: {exc}") from exc
    groups = attach_groups(env, plan, device, timeout_s)
    groups.attempt = attempt
    groups.notes = notes
    groups.store = scoped(store, f"attempt-{attempt}/ctl/")  # keeps the run's keys: records are sealed
    return groups


_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
_NEW_GROUP_BINDS = "device_id" in inspect.signature(dist.new_group).parameters  # not in every torch >= 2.4


@contextlib.contextmanager
def nccl_error_handling(keep_users: bool = False):
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` while reshardctl's NCCL groups are built (each reads it when
    it is created): a timed-out or failed communicator of ours is aborted and the process lives on to
    report and vote. Torch's default (3) tears the process down; the RL framework's own groups keep
    their setting. ``keep_users``: a value the user set for reshardctl's own ranks (``reshardctl run``)
    is kept; under the API the framework's value is about its groups, so ours get 2 regardless. Also a
    short ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` unless one is set (nccl_watchdog.py: the watchdog of a
    failed group sleeps 4x it before it aborts, and the group's destructor joins the watchdog)."""
    wanted = {nccl_watchdog.WAIT_TIMEOUT_DUMP_MS: nccl_watchdog.SHORT_DUMP_WAIT_MS}
    if not (keep_users and os.environ.get(_ERROR_HANDLING) is not None):
        wanted[_ERROR_HANDLING] = "2"
    old = {k: os.environ.get(k) for k in wanted}
    for k, v in wanted.items():
        if k == _ERROR_HANDLING or old[k] is None:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v



def attach_groups(env: RankEnv, plan, device: torch.device, timeout_s: float, *, own_data: bool = False) -> Groups:
    """On an initialised default group (ours, or an RL framework's): the control group, the data group
    (the default group, or with ``own_data`` a fresh one, which the API rebuilds after a failure) and the
    plan's broadcast sub-groups (collective: every rank calls this in the same order); then a check that
    every rank is there. On NCCL the groups are built with ``nccl_error_handling`` and bound to the
    device (``device_id``: their communicators are set up now, in the same order on every rank, not
    lazily at a first broadcast outside any deadline; where torch's ``new_group`` takes no ``device_id``
    they stay lazy)."""
    timeout = timedelta(seconds=timeout_s)
    nccl = env.backend == "nccl"
    bind = {"device_id": device} if nccl and _NEW_GROUP_BINDS else {}
    try:
        groups = Groups(env, device, timeout)
        ranks = list(range(env.world_size))
        groups.ctrl = dist.new_group(ranks, timeout=timeout, backend="gloo")
        with nccl_error_handling(keep_users=not own_data) if nccl else contextlib.nullcontext():
            groups.data = (dist.new_group(ranks, timeout=timeout, backend=env.backend, **bind) if own_data
                           else dist.group.WORLD)
            for members in broadcast_groups(plan):
                if len(members) == env.world_size:
                    pg = groups.data
                else:
                    pg = dist.new_group(list(members), timeout=timeout, backend=env.backend, **bind)
                if env.global_rank in members:
                    groups.broadcast[members] = pg
        probe = torch.ones(1)
        dist.all_reduce(probe, group=groups.ctrl)
        if int(probe.item()) != env.world_size:
            raise TransferError(f"group check: all-reduce gave {probe.item()}, expected {env.world_size}")
        if env.backend == "nccl":  # NCCL communicators up before the first refit, within the deadline
            p = torch.ones(1, device=device)
            wait_works([dist.all_reduce(p, group=groups.data, async_op=True)], groups, timeout_s, "group check")
        return groups
    except (RuntimeError, ValueError, TypeError, AssertionError) as exc:  # torch's own checks (a bound device)
        raise TransferError(f"rank {env.global_rank}: process groups ({env.backend}) failed: {exc}") from exc



class Abandoned(TransferError):
    """This rank stopped waiting because another rank published a failure of the same attempt first
    (a knock-on failure: the root cause is elsewhere)."""


TAG_CONNECT = (1 << 30) - 3  # pre-connect's messages (the control plane has 2**30 - 2)


def program_peers(plan, rank: int) -> tuple[list[int], list[int]]:
    """The peers this rank sends to and receives from in a plan, or a list of plans (rounds, relays and
    the gathers of broadcast buckets), each sorted: the directions its program uses, no others (NCCL
    gives every connected direction its own buffers)."""
    sends: set[int] = set()
    recvs: set[int] = set()
    for pl in plan if isinstance(plan, (list, tuple)) else [plan]:
        for s in pl.steps_for(rank):
            if isinstance(s, P2PRound):
                sends.update(pr.peer for pr in s.sends)
                recvs.update(pr.peer for pr in s.recvs)
            elif isinstance(s, BroadcastBucket):
                for g in s.gather:
                    if g.peer == rank and rank != s.root:
                        sends.add(s.root)
                    elif rank == s.root and g.peer != rank:
                        recvs.add(g.peer)
    sends.discard(rank)
    recvs.discard(rank)
    return sorted(sends), sorted(recvs)


def _finish(works, stop: threading.Event, cuda: bool) -> None:
    """Wait for ``works`` in the pre-connect's helper thread: gloo's blocking ``wait`` (bounded by the
    group timeout), NCCL's completion polled until done or until the waiting thread gave up (``stop``)."""
    if cuda:
        while not all(w.is_completed() for w in works):
            if stop.is_set():
                return
            time.sleep(1e-3)
    for w in works:
        w.wait()


def preconnect(groups: Groups, plan, timeout_s: float) -> dict:
    """Connect every path the refits will use, once, right after the groups are built, bounded like
    every other wait: one small exchange with every program peer of this rank (``program_peers``: one
    ``batch_isend_irecv`` on the data group, the directions the program uses), then one broadcast per
    broadcast group this rank is in, in the plan's order (``broadcast_groups``, the same on every rank),
    one group at a time. NCCL connects point-to-point channels lazily inside the post (``ncclGroupEnd``)
    and a sub-communicator's rings at its first collective: a peer that never posts would hold the
    posting thread there, outside every deadline. So the posts run in a helper thread and this thread
    waits with the run's deadline, stops at once when another rank published a failure (``Abandoned``),
    and on its own failure publishes it, aborts reshardctl's communicators (CUDA) and raises
    ``TransferError``. On gloo the same exchange runs (cheap), so the path is exercised everywhere.
    Returns what it connected (``peers``, ``groups``, ``seconds``)."""
    rank = groups.env.global_rank
    cuda = groups.device.type == "cuda"
    sends, recvs = program_peers(plan, rank)
    subgroups = [(m, groups.broadcast[m]) for m in broadcast_groups(plan) if m in groups.broadcast]
    stage = [f"the exchange with its {len(set(sends) | set(recvs))} program peer(s)"]
    stop = threading.Event()

    def job() -> None:
        if cuda:
            torch.cuda.set_device(groups.device)  # the device is per thread
        one = torch.ones(1, dtype=torch.uint8, device=groups.device)
        ins = [torch.zeros(1, dtype=torch.uint8, device=groups.device) for _ in recvs]
        ops = [dist.P2POp(dist.isend, one, p, group=groups.data, tag=TAG_CONNECT) for p in sends]
        ops += [dist.P2POp(dist.irecv, t, p, group=groups.data, tag=TAG_CONNECT) for p, t in zip(recvs, ins)]
        if ops:
            _finish(dist.batch_isend_irecv(ops), stop, cuda)
        for members, pg in subgroups:
            if stop.is_set():
                return
            stage[0] = f"the broadcast over group {list(members)}"
            b = torch.zeros(1, dtype=torch.uint8, device=groups.device)
            _finish([dist.broadcast(b, src=members[0], group=pg, async_op=True)], stop, cuda)

    t0 = time.monotonic()
    done, err = start_helper(job)
    end = t0 + timeout_s + 1.0  # gloo's own timeout fires first
    next_check = t0 + 0.05
    failure: TransferError | None = None
    while not done.wait(0.05):
        now = time.monotonic()
        if groups.store is not None and now >= next_check:
            next_check = now + 0.1
            rec = groups.failure()
            if rec is not None:
                failure = Abandoned(f"pre-connect: stopped waiting: {rec}")
                break
        if now > end:
            failure = TransferError(
                f"rank {rank}: pre-connect not complete within {timeout_s:g} s, in {stage[0]}: a peer never "
                f"posted (dead, hung, or still building its groups)")
            break
    if failure is None and err:
        failure = TransferError(f"rank {rank}: pre-connect failed in {stage[0]}: {err[0]}")
    if failure is not None:
        stop.set()
        if not isinstance(failure, Abandoned):
            groups.publish_failure(f"rank {rank} failed in pre-connect: {failure}")
        abort_after_failure(groups)
        raise failure
    return {"peers": len(set(sends) | set(recvs)), "groups": len(subgroups), "seconds": time.monotonic() - t0}


TAG_CONTROL = (1 << 30) - 2  # the control plane's tree all-reduce (the checksum exchange has 2**30 - 1)


class SubtreeLost(TransferError):
    """The tree all-reduce's result is complete on this rank, but forwarding it to a child failed (a dead
    or silent child): that child's part of the tree did not get it from here."""


def tree_all_reduce(v: torch.Tensor, combine, *, rank: int, world: int, group, wait, progress=None) -> None:
    """``v`` (a CPU tensor) combined elementwise over ranks ``0 .. world - 1`` of ``group``, in place:
    up a binomial tree to rank 0 (at level ``k`` rank ``r + k`` sends to ``r`` where ``r % 2k == 0``),
    then down it, ``2 ceil(log2 world)`` steps of one message each, every one waited by
    ``wait(works)`` (the runtime: ``wait_all`` inside one ``run_bounded``, so the whole tree is bounded
    and costs one helper thread). gloo's own all-reduce is a ring of ``2 (world - 1)``
    sequential steps, which for these few bytes costs a latency per step: 14 steps took 7-12 ms on 8
    ranks sharing 2 cores here, and would be ~1,000 at 512 ranks. ``combine(a, b)`` returns the
    elementwise result (associative and commutative: MIN, SUM).

    ``progress`` (optional; the commit protocol's, commit.py) is told how far this rank got, and may
    stop it: ``progress.begin_send()`` just before this rank's contribution goes up (False: stop, nothing
    sent), ``progress.result()`` once ``v`` holds the final result here, before it is forwarded down
    (False, the root only: stop, nothing forwarded). A child that cannot be sent the result does not
    undo it: the other children still get it, then ``SubtreeLost`` is raised (``v`` holds the result)."""
    levels = []
    k = 1
    while k < world:
        levels.append(k)
        k *= 2
    tmp = torch.empty_like(v)
    for k in levels:  # up: gather into rank 0
        if rank % (2 * k) == k:
            if progress is not None and not progress.begin_send():
                raise TransferError("stopped before this rank's contribution was sent")
            wait([dist.isend(v, rank - k, group=group, tag=TAG_CONTROL)])
            break
        if rank + k < world:
            wait([dist.irecv(tmp, rank + k, group=group, tag=TAG_CONTROL)])
            v.copy_(combine(v, tmp))
    if rank == 0 and progress is not None and not progress.result():
        raise TransferError("stopped before the result was forwarded")
    lost: list[str] = []
    for k in reversed(levels):  # down: rank 0's result to every rank
        if rank % (2 * k) == 0:
            if rank + k < world:
                try:
                    wait([dist.isend(v, rank + k, group=group, tag=TAG_CONTROL)])
                except (RuntimeError, TransferError) as exc:
                    lost.append(f"rank {rank + k}: {exc}")
        elif rank % (2 * k) == k:
            wait([dist.irecv(v, rank - k, group=group, tag=TAG_CONTROL)])
            if progress is not None:
                progress.result()
    if lost:
        raise SubtreeLost(f"result complete here, not forwarded to {'; '.join(lost)}")


def wait_works(works, groups: "Groups | None", timeout_s: float, what: str, *, device: bool | None = None) -> None:
    """Wait for posted ops, bounded: complete (or raise: a dead peer, a backend timeout) within
    ``timeout_s``, and stop at once when another rank published a failure of this attempt
    (``Abandoned``). gloo works (``device`` False, or a CPU data plane) are waited in a helper thread
    (their ``wait`` blocks, bounded by the group timeout) while this thread watches the store
    (``run_bounded``). NCCL works (``device``, default: the data plane is CUDA): ``work.wait()`` orders
    the current stream after the transfer, then this thread blocks in one ``Event.synchronize()`` on
    that stream while a ``DeadlineWatch`` thread holds the deadline and the store's failure check and
    aborts reshardctl's communicators past the one or at the other (the abort ends the kernels and so
    releases the blocked thread; the process lives on to report)."""
    works = list(works)
    if not works:
        return
    if device is None:
        device = groups is not None and groups.device.type == "cuda"
    if not device:
        run_bounded(lambda: wait_all(works), groups, timeout_s, what)
        return
    watch = DeadlineWatch(timeout_s, abort=lambda: abort_data_plane(groups), failure=groups.failure)
    watch.watch(works, what)
    error: BaseException | None = None
    with watch:
        try:
            for w in works:
                w.wait()  # NCCL: the current stream waits for the transfer; the host does not
            done = torch.cuda.Event(blocking=True)  # blocking: the host sleeps in the wait, no spin
            done.record(torch.cuda.current_stream(groups.device))
            done.synchronize()
        except RuntimeError as exc:  # an aborted or failed communicator
            error = exc
    raise_outcome(watch.outcome, what, timeout_s)
    if error is not None:
        raise error


def raise_outcome(outcome, what: str, timeout_s: float) -> None:
    """A ``DeadlineWatch`` that aborted as an exception: ``Abandoned`` (another rank's failure) or
    ``TransferError`` (past the deadline); nothing when it did not abort."""
    if outcome is None:
        return
    if outcome.kind == "failure":
        raise Abandoned(f"{what}: stopped waiting: {outcome.record}")
    raise TransferError(f"{what}: not complete within {timeout_s:g} s")


def wait_all(works) -> None:
    """Each work's blocking ``wait()`` (gloo: bounded by its group's timeout, raises on a dead peer)."""
    for w in works:
        w.wait()


def start_helper(job) -> tuple[threading.Event, list[BaseException]]:
    """Start ``job()`` in a daemon helper thread: (an event set when it ends, the error it raised if
    any). ``run_bounded`` waits on it while watching the store; calibration times a control round the
    same way (calibrate/microbench.py)."""
    done, err = threading.Event(), []

    def run() -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            err.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="reshardctl-wait", daemon=True).start()
    return done, err


def run_bounded(job, groups: "Groups | None", timeout_s: float, what: str) -> None:
    """``job()``, whose blocking gloo waits are each bounded by their group's timeout, in a helper thread
    while this thread watches the store: returns when it is done (re-raising its error), raises
    ``Abandoned`` as soon as another rank published a failure of this attempt, ``TransferError`` past
    ``timeout_s`` (the helper thread is a daemon: a wait gloo has not yet timed out does not hold the
    process). Without a store: ``job()`` here."""
    if groups is None or groups.store is None:
        job()
        return
    done, err = start_helper(job)
    end = time.monotonic() + timeout_s + 1.0  # the backend's own timeout fires first
    next_check = time.monotonic() + 0.05
    while not done.wait(0.05):
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.1
            rec = groups.failure()
            if rec is not None:
                raise Abandoned(f"{what}: stopped waiting: {rec}")
        if now > end:
            raise TransferError(f"{what}: not complete within {timeout_s:g} s")
    if err:
        raise err[0]


def abort_data_plane(groups: "Groups") -> None:
    """Abort reshardctl's NCCL communicators (torch's private abort; best effort; once per attempt: a
    group aborted is gone from torch's registry). Where reshardctl owns the default group (its own
    ranks: the data plane is WORLD) that is every group of the process; under the API only the groups
    it created (``own_groups``), never the RL framework's, in one NCCL group call as torch aborts several
    communicators (aborted one by one they can wait on each other). ``ncclCommAbort`` ends the kernels
    at once; a destroy (``ncclCommFinalize``) would wait for them, which for a dead peer is forever."""
    if getattr(groups, "aborted", False):
        return
    try:
        groups.aborted = True
    except AttributeError:  # a read-only stand-in
        pass
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is None:
        return
    try:
        if groups.data is dist.group.WORLD:
            abort()
            return
        try:
            backend = groups.data._get_backend(torch.device("cuda"))
        except RuntimeError:  # no NCCL backend on this group
            backend = None
        grouped = hasattr(backend, "_group_start")
        if grouped:
            backend._group_start()
        try:
            for pg in own_groups(groups):
                try:
                    abort(pg)
                except Exception:  # noqa: BLE001 - one gone already (aborted before): the others still
                    pass
        finally:
            if grouped:
                backend._group_end()
    except Exception:  # noqa: BLE001 - best effort: the process must go on to report
        pass


def abort_after_failure(groups: "Groups | None") -> None:
    """The exit of every failed refit (runtime/refit.py), on every rank (the root cause, a knock-on
    ``Abandoned``, a verification failure): on CUDA reshardctl's communicators are aborted now, before
    the rank settles, so no NCCL kernel of the attempt keeps spinning on the GPU and no device-wide sync
    (the framework's, or this rank's own teardown) waits for one. gloo has no kernels: its groups are
    released after settling (``release``)."""
    if groups is not None and groups.device.type == "cuda":
        abort_data_plane(groups)


def release(groups: "Groups") -> None:
    """Tear down one attempt's groups after every rank settled (``rebuild``, the API's rebuild): NCCL
    groups are aborted, never destroyed (a destroy finalizes: it waits for every kernel of the
    communicator); gloo groups are destroyed. As reshardctl's own ranks that is every group (the default
    group included); under the API its own data, broadcast and control groups, never the framework's:
    after a release none of them is left in torch's registry (``_world.pg_map``)."""
    cuda = groups.device.type == "cuda"
    if cuda:
        abort_data_plane(groups)
    if groups.data is dist.group.WORLD:
        shutdown()
        return
    registry = dist.distributed_c10d._world.pg_map
    for pg in [groups.ctrl] if cuda else [*own_groups(groups), groups.ctrl]:
        if pg is not None and pg in registry:
            try:
                dist.destroy_process_group(pg)
            except Exception:  # noqa: BLE001 - best effort: a group half gone must not stop the rebuild
                pass


def own_groups(groups: "Groups") -> list:
    """The data-plane groups reshardctl created (its data group and broadcast sub-groups), each once;
    never the default group (WORLD), which is the RL framework's under the API."""
    out: list = []
    for pg in [groups.data, *groups.broadcast.values()]:
        if pg is not None and pg is not dist.group.WORLD and all(pg is not q for q in out):
            out.append(pg)
    return out


SETTLE_POLL_S = 0.05
_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "timed out", "not complete within",
              "unreachable", "killed by signal", "no report")


def lost_peer(cause: BaseException | str | None) -> bool:
    """Does the failure that ended an attempt say a peer is gone or silent (a closed connection, a reset,
    a timeout, the store unreachable)? Such a peer will not settle: settling need not wait for it."""
    text = str(cause or "").lower()
    return any(w in text for w in _LOST_PEER)


def settle(store, env: RankEnv, attempt: int, timeout_s: float, cause: BaseException | str | None = None,
           poll_s: float = SETTLE_POLL_S) -> list[int]:
    """Every rank says it has left attempt ``attempt``; wait (bounded) until all did. Returns the ranks
    that cannot be counted on (empty: all settled, a rebuild is safe; the same verdict on every rank).

    One counter in the store (``store.add``): a rank arriving adds 1, or, when the failure that ended its
    attempt (``cause``) says a peer is lost (a closed connection, a timeout: ``lost_peer``), ``world + 1``,
    which tells every rank that not every rank will arrive. One store call per poll (``add(key, 0)``
    reads the counter). Settling therefore ends as soon as the outcome is known: all arrived, or one rank
    saw a dead or silent peer (a hung rank that caused a timeout is not waited for again), or the store
    itself is gone (rank 0); ``timeout_s`` only bounds the case where nobody knows. Only at the end are
    the per-rank keys read, to name the ranks: those that did not arrive, else those that saw a lost
    peer. The marks are sealed (``run_store.seal``) and only genuine ones count: an outsider's ``add`` to
    the counter cannot end settling early (it is believed only when the marks agree), and an outsider's
    mark counts for nothing."""
    world = env.world_size
    key = f"settled/{attempt}"
    me = f"{key}/{env.global_rank}"
    lost = lost_peer(cause)
    try:
        store.set(me, seal(store, me, "lost" if lost else "ok"))  # a mark without the run's token: nothing
        n = store.add(key, world + 1 if lost else 1)
        end = time.monotonic() + timeout_s
        while True:
            if n >= world:  # the counter says the outcome is known: the sealed marks must say so too
                marks = {r: read_sealed(store, f"{key}/{r}") for r in range(world)}
                if all(v == "ok" for v in marks.values()):
                    return []
                if any(v == "lost" for v in marks.values()):
                    missing = [r for r, v in marks.items() if v is None]
                    return missing or [r for r, v in marks.items() if v == "lost"]
                # counts without genuine marks: an outsider's add; only the timeout ends it now
            if time.monotonic() >= end:
                break
            time.sleep(poll_s)
            n = store.add(key, 0)
        marks = {r: read_sealed(store, f"{key}/{r}") for r in range(world)}
        missing = [r for r, v in marks.items() if v is None]
        return missing or [r for r, v in marks.items() if v == "lost"]
    except Exception:  # noqa: BLE001 - the store went with rank 0: no retry is possible
        return [0]


def rebuild(groups: Groups, plan, store, timeout_s: float) -> Groups:
    """Fresh groups for the next attempt (every rank calls it after ``settle``): the old ones released
    (NCCL: aborted first, never finalized), torch's ``exception_dump`` key of the failed attempt deleted
    from the root store (nccl_watchdog.py), then the new groups."""
    release(groups)
    nccl_watchdog.clear_dump_signal(for_torch(store))  # torch's root store: the sealed one
    return init_groups(groups.env, plan, store, timeout_s, attempt=groups.attempt + 1)


def shutdown() -> None:
    """Destroy every group of the process (reshardctl's own ranks at a normal end: nothing is pending;
    after a failure on CUDA the groups were aborted first and the default group is gone already)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out (a peer may be gone)
            pass
