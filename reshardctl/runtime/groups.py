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
  point-to-point messages (``control_tree.tree_all_reduce``: ``2 ceil(log2 n)`` steps, where gloo's ring takes
  ``2 (n - 1)``). Every wait is bounded (``bounded_wait.wait_works``): gloo raises on a dead or silent peer within
  the timeout; on NCCL the host blocks in an event while a helper thread holds the deadline
  (``deadline_watch.py``) and aborts past it; and a rank stops waiting as soon as another rank
  published a failure of the attempt in the store.
* Attempts: ``rebuild`` tears every group down and builds fresh ones under a new store prefix
  (``attempt-<k>``), after every rank settled (``settle.settle``), so nothing left posted by a failed attempt
  can match the next one's messages. On CUDA every failed refit leaves through ``abort.abort_after_failure``
  (reshardctl's communicators aborted at once); ``release`` (in ``rebuild``) aborts NCCL groups and
  destroys gloo ones, never finalizing an NCCL communicator after a failure.
* First contact: ``preconnect.preconnect`` connects every point-to-point direction and broadcast group the
  program uses right after the groups are built, under the deadline (NCCL connects lazily inside the
  post, outside every bound). Torch's NCCL monitor is kept from killing the process for reshardctl's
  groups by ``nccl_watchdog.py`` (docs/gpu.md, "Failures on NCCL").
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from reshardctl.errors import LaunchError, TransferError
from reshardctl.runtime import nccl_watchdog
from reshardctl.runtime.abort import abort_data_plane, on_nccl, own_groups
from reshardctl.runtime.bounded_wait import wait_works
from reshardctl.runtime.env import RankEnv
from reshardctl.runtime.update_world import registered
from reshardctl.runtime.run_store import (
    CHECK_KEY, RunKeys, RunStore, answers, challenge, for_torch, listen_fd, scoped, seal, unseal,
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

    @property
    def host_staged(self) -> bool:
        """gloo as the data plane of CUDA weights (``RunOptions.device`` "cuda-gloo"): every message of the
        data plane goes through host memory (host_staging.py); nothing to abort after a failure."""
        return self.device.type == "cuda" and self.env.backend == "gloo"

    @property
    def wire_device(self) -> torch.device:
        """Where the data plane's own buffers live (pre-connect, the raw baseline): the host when staged."""
        return torch.device("cpu") if self.host_staged else self.device

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



def default_world_groups(device: torch.device, timeout: timedelta):
    """The group factory over the initialised default group (``dist.new_group``: every rank of the
    default group calls it, members or not; a non-member gets torch's ``NON_GROUP_MEMBER``). NCCL
    groups are bound to ``device`` where torch's ``new_group`` takes a ``device_id``."""
    def new_group(members, backend: str):
        bind = {"device_id": device} if backend == "nccl" and _NEW_GROUP_BINDS else {}
        return dist.new_group(list(members), timeout=timeout, backend=backend, **bind)
    return new_group


def attach_groups(env: RankEnv, plan, device: torch.device, timeout_s: float, *, own_data: bool = False,
                  new_group=None) -> Groups:
    """The control group, the data group (the default group, or with ``own_data`` a fresh one, which
    the API rebuilds after a failure) and the plan's broadcast sub-groups (collective: every rank calls
    this in the same order); then a check that every rank is there. ``new_group(members, backend)``
    makes one group over ``env``'s ranks: by default over the initialised default group (ours, or an
    RL framework's: ``default_world_groups``), or over reshardctl's own update world
    (``update_world.UpdateWorld.new_group``: two worlds joined, the default group never used; needs
    ``own_data``). On NCCL the groups are built with ``nccl_error_handling`` and bound to the device
    (``device_id``: their communicators are set up now, in the same order on every rank, not lazily at
    a first broadcast outside any deadline; where torch's ``new_group`` takes no ``device_id`` they stay
    lazy)."""
    timeout = timedelta(seconds=timeout_s)
    nccl = env.backend == "nccl"
    if new_group is None:
        new_group = default_world_groups(device, timeout)
    elif not own_data:
        raise TransferError("groups of an update world need their own data group (own_data=True)")
    groups = Groups(env, device, timeout)
    try:
        ranks = list(range(env.world_size))
        groups.ctrl = new_group(ranks, "gloo")
        wanted = broadcast_groups(plan)
        _check_same_groups(groups.ctrl, env, wanted)
        with nccl_error_handling(keep_users=not own_data) if nccl else contextlib.nullcontext():
            groups.data = new_group(ranks, env.backend) if own_data else dist.group.WORLD
            for members in wanted:
                if len(members) == env.world_size:
                    pg = groups.data
                else:
                    pg = new_group(members, env.backend)
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
    except BaseException as exc:
        if own_data:  # the groups made so far are the API's own: none stays in torch's registry
            release(groups)
        if isinstance(exc, (RuntimeError, ValueError, TypeError, AssertionError)):  # torch's own checks
            raise TransferError(f"rank {env.global_rank}: process groups ({env.backend}) failed: {exc}") from exc
        raise


def _check_same_groups(ctrl, env: RankEnv, wanted: list[tuple[int, ...]]) -> None:
    """Every rank is about to create the same broadcast groups (one all-reduce of a digest of them over
    the control group), else a ``TransferError`` on every rank now, not a group creation that waits for
    members that never come (ranks given different plans, or a transport source on some ranks only)."""
    digest = int.from_bytes(hashlib.sha256(repr(wanted).encode()).digest()[:7], "big")
    probe = torch.tensor([digest, -digest], dtype=torch.int64)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=ctrl)
    if int(probe[0]) != digest or int(-probe[1]) != digest:
        raise TransferError(f"rank {env.global_rank}: the ranks would create different broadcast groups (this "
                            f"rank: {len(wanted)}): every rank must pass the same plan, and a transport source "
                            f"on every rank or on none")


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


def release(groups: "Groups") -> None:
    """Tear down one attempt's groups after every rank settled (``rebuild``, the API's rebuild): NCCL
    groups are aborted, never destroyed (a destroy finalizes: it waits for every kernel of the
    communicator); gloo groups are destroyed. As reshardctl's own ranks that is every group (the default
    group included); under the API its own data, broadcast and control groups, never the framework's:
    after a release none of them is left in torch's registry (``update_world.registered``)."""
    cuda = on_nccl(groups)
    if cuda:
        abort_data_plane(groups)
    if groups.data is not None and groups.data is dist.group.WORLD:
        shutdown()
        return
    for pg in [groups.ctrl] if cuda else [*own_groups(groups), groups.ctrl]:
        if registered(pg):
            try:
                dist.destroy_process_group(pg)
            except Exception:  # noqa: BLE001 - best effort: a group half gone must not stop the rebuild
                pass
