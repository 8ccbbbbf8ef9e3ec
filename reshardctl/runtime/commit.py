"""The commit of one refit on the control plane: all or nothing for the surviving inference ranks, under
any single failure (a death, a hang, an exit) at any moment. The argument, window by window, is in
docs/commit-protocol.md; in short:

1. **Vote**: each rank's verdict, ``OK`` (no error, every received checksum matched, every destination
   box written exactly once, every local copy equal, the optional whole-model check passed),
   ``BAD_DATA`` or ``FAILED``, in its own slot of one MIN all-reduce (a tree, ``tree_all_reduce``):
   a rank that has the result knows every rank's verdict. Anything but all-OK: nothing changes, every
   rank raises ``VerificationError`` (bad data) or ``TransferError``.
2. **Swap**: all OK is a fact once any rank has the result (every rank's verdict is in it, so every
   inference rank holds verified new bytes): a rank that has it swaps staged <-> current (a pointer
   swap; the previous weights stay in the staged copy until the next refit's bytes arrive).
3. **Acknowledgement**: a second all-reduce; a rank that has its result knows that every rank had the
   vote's result, so every inference rank swapped: only such a rank may report the refit committed.
4. **Repair** (``repair``), on an inference rank whose refit failed after the common start: a bounded
   exchange with every other inference rank, point to point over gloo (no rank 0, no store needed):
   each says what it knows of the decision (``COMMIT``: it had the vote's all-OK result; ``ABORT``: its
   own verdict never left, or the vote said no; ``UNKNOWN``: its verdict left, the result never came).
   A rank that does not know commits iff any other says ``COMMIT``. A split that remains (it takes a
   second failure) is carried in the ranks' reports and the CLI says so (exit 1).
5. **Agreement** (``agree``): at the common start of the next refit, and once at the end of a session,
   every rank's committed step is gathered; a rank ahead of the others rolls back to the previous
   weights it still holds; a disagreement that cannot be repaired is an error.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from reshardctl.errors import TransferError, VerificationError
from reshardctl.runtime.bounded_wait import Abandoned, run_bounded, wait_all
from reshardctl.runtime.control_tree import SubtreeLost, tree_all_reduce
from reshardctl.runtime.groups import Groups
from reshardctl.runtime.local_weights import LocalWeights, byte_view
from reshardctl.runtime.weights import WeightSource
from reshardctl.topology import is_trainer, side_of_global, train_world_of

FAILED, BAD_DATA, OK = 0, 1, 2
_WORDS = {FAILED: "failed", BAD_DATA: "failed verification", OK: "ok"}
UNKNOWN, ABORT, COMMIT = 0, 1, 2  # what a rank knows of a refit's decision (the repair's messages)
KNOWS = {UNKNOWN: "unknown", ABORT: "abort", COMMIT: "commit"}
LOST = -1  # a repair peer whose connection failed or that stayed silent
TAG_REPAIR = 1 << 29  # + step % 2**20 (the control tree has 2**30 - 2, the checksum exchange 2**30 - 1)
REPAIR_GRACE_S = 0.5  # all inference ranks but one heard: the silent one is the failed one after this


class Progress:
    """How far this rank got in one tree all-reduce (``tree_all_reduce``'s ``progress``). ``stop()``
    freezes it and says where it was: ``NOTHING`` (its contribution never left, or, the root, the result
    was never forwarded: the all-reduce cannot complete anywhere), ``SENT`` (it left; the result did not
    come) or ``RESULT``. ``on_result`` (a drill point) runs when the result arrives, before it is
    forwarded."""

    NOTHING, SENT, RESULT = 0, 1, 2

    def __init__(self, root: bool, on_result=None):
        self._lock = threading.Lock()
        self.state, self.stopped, self.root, self.on_result = self.NOTHING, False, root, on_result

    def begin_send(self) -> bool:
        with self._lock:
            if self.stopped:
                return False
            self.state = self.SENT
            return True

    def result(self) -> bool:
        with self._lock:
            if self.stopped and self.root and self.state != self.RESULT:
                return False
            self.state = self.RESULT
        if self.on_result is not None:
            self.on_result()
        return True

    def stop(self) -> int:
        with self._lock:
            self.stopped = True
            return self.state


def full_check(staged: LocalWeights, source: WeightSource, step: int, limit: int = 20) -> list[str]:
    """Every destination box equals the weight source's values for ``step`` (bytes)."""
    problems = []
    for i, boxes in staged.boxes.items():
        for box, have in zip(boxes, staged.data[i]):
            want = source.region(i, box, step, have.device)
            if not torch.equal(byte_view(have), byte_view(want)):
                problems.append(f"{staged.model.tensors[i].name} {box}: differs from the step-{step} weights")
                if len(problems) >= limit:
                    return problems
    return problems


_COMBINE = {dist.ReduceOp.MIN: torch.minimum, dist.ReduceOp.SUM: torch.add}


def _all_reduce(groups: Groups, v: torch.Tensor, op, what: str, progress: Progress | None = None,
                in_main: bool = False) -> torch.Tensor:
    """One bounded all-reduce on the control group (CPU tensor): a binomial tree (``tree_all_reduce``)
    run in one helper thread while this one watches for another rank's failure (``run_bounded``);
    ``in_main``: in this thread (a hang drill at the result must stop the whole rank)."""
    env = groups.env
    timeout_s = groups.timeout.total_seconds()

    def job():
        tree_all_reduce(v, _COMBINE[op], rank=env.global_rank, world=env.world_size, group=groups.ctrl,
                        wait=wait_all, progress=progress)

    try:
        job() if in_main else run_bounded(job, groups, timeout_s, what)
    except Abandoned:
        raise
    except SubtreeLost as exc:
        raise SubtreeLost(f"{what}: {exc}") from exc
    except (RuntimeError, TransferError) as exc:
        raise TransferError(f"{what} failed: {exc}") from exc
    return v


def _tree_round(groups: Groups, v: torch.Tensor, op, what: str, on_result=None,
                in_main: bool = False) -> tuple[bool, int, BaseException | None]:
    """``_all_reduce`` that says how far it got: (result here, ``Progress`` state, the error if any). A
    result that arrived before the error (a child that could not be sent it, an abandoned wait after
    it) still counts."""
    progress = Progress(groups.env.global_rank == 0, on_result)
    try:
        _all_reduce(groups, v, op, what, progress, in_main)
    except TransferError as exc:
        where = progress.stop()
        return where == Progress.RESULT, where, exc
    progress.stop()
    return True, Progress.RESULT, None


def vote(groups: Groups, code: int, on_result=None, in_main: bool = False) -> tuple[list[int], BaseException | None]:
    """Phase 1: every rank's verdict, gathered by one MIN all-reduce. Returns the verdicts (and the error,
    if forwarding them to a child failed after they arrived); when they never arrived, raises the error with
    ``known``: ``ABORT`` (this rank's verdict never left, so no rank can have the result) or ``UNKNOWN``."""
    env = groups.env
    v = torch.full((env.world_size,), OK, dtype=torch.int64)
    v[env.global_rank] = code
    have, where, exc = _tree_round(groups, v, dist.ReduceOp.MIN, f"rank {env.global_rank}: the commit vote",
                                   on_result, in_main)
    if not have:
        exc.known = ABORT if where == Progress.NOTHING else UNKNOWN
        raise exc
    return [int(x) for x in v.tolist()], exc


def learn(groups: Groups, step: int, on_result=None, in_main: bool = False) -> BaseException | None:
    """Phase 3: every rank had the vote's result (raises ``TransferError`` when this rank cannot tell).
    Returns the error of a child that could not be sent the result, if any."""
    env = groups.env
    v = torch.ones(1, dtype=torch.int64)
    have, _, exc = _tree_round(groups, v, dist.ReduceOp.SUM, f"rank {env.global_rank}: the commit acknowledgement",
                               on_result, in_main)
    if not have:
        raise exc
    if int(v.item()) != env.world_size:
        raise TransferError(f"refit of step {step}: acknowledgement {int(v.item())} of {env.world_size}")
    return exc


def mark_acked(groups: Groups, step: int) -> None:
    """Count this rank's completed acknowledgement in the attempt's store (best effort): a repairing rank
    that reads a count above 0 knows every rank had the vote's result, so nobody needs its word."""
    if groups.store is None:
        return
    try:
        groups.store.add(f"acked/{step}", 1)
    except Exception:  # noqa: BLE001 - the store went with rank 0: repairs then wait for their peers
        pass


def repair(groups: Groups, step: int, known: int, timeout_s: float) -> tuple[int, dict[int, int], str]:
    """The failure-time exchange among the inference ranks (call it on an inference rank whose refit of
    ``step`` failed after the common start): this rank's knowledge ``known`` (``COMMIT``/``ABORT``/
    ``UNKNOWN``) goes to every other inference rank and theirs comes back, point to point on the control
    group (tag per step), each peer's pair of messages waited in a helper thread. It ends when every peer
    answered or failed (a closed connection: at once), or when the attempt's store counts a completed
    acknowledgement (then every rank had the result: nobody needs this rank's word), or when all peers but
    one answered and ``REPAIR_GRACE_S`` passed (the silent one is the failed one; only while the store
    answers, so the others' failures reach them at once), or after ``2 timeout_s + 2`` s (a peer's own
    failure takes at most a timeout to reach it, twice in a row: vote, then acknowledgement).

    Returns (the decision: ``COMMIT`` when this rank or any peer had the all-OK result or an
    acknowledgement completed, else ``ABORT``; every peer's answer, ``LOST`` for none; a note)."""
    env = groups.env
    train_world = train_world_of(env.global_rank, env.side_rank)
    peers = [r for r in range(train_world, env.world_size) if r != env.global_rank]
    tag = TAG_REPAIR + step % (1 << 20)
    mine = torch.tensor([step, known], dtype=torch.int64)
    heard: dict[int, int] = {}
    done: set[int] = set()
    lock = threading.Lock()

    def talk(p: int, recv, send, buf) -> None:
        try:
            recv.wait()
            with lock:
                heard[p] = int(buf[1]) if int(buf[0]) == step else UNKNOWN
            send.wait()
        except Exception:  # noqa: BLE001 - a dead or silent peer: accounted as lost
            with lock:
                heard.setdefault(p, LOST)
        with lock:
            done.add(p)

    for p in peers:  # posted here, in one thread; only the waits run in helpers
        buf = torch.full((2,), -1, dtype=torch.int64)
        try:
            recv = dist.irecv(buf, p, group=groups.ctrl, tag=tag)
            send = dist.isend(mine, p, group=groups.ctrl, tag=tag)
        except Exception:  # noqa: BLE001 - the connection to it is gone already
            heard[p] = LOST
            done.add(p)
            continue
        threading.Thread(target=talk, args=(p, recv, send, buf), name="reshardctl-repair", daemon=True).start()
    t0 = time.monotonic()
    end = t0 + 2 * timeout_s + 2.0
    acked, store_ok, next_store = 0, groups.store is not None, t0
    last_n, last_change, why = -1, t0, "every peer answered or failed"
    while True:
        with lock:
            n = len(done)
        now = time.monotonic()
        if n != last_n:
            last_n, last_change = n, now
        if n == len(peers):
            break
        if store_ok and now >= next_store:
            next_store = now + 0.1
            try:
                acked = int(groups.store.add(f"acked/{step}", 0))
            except Exception:  # noqa: BLE001 - the store went with rank 0
                store_ok = False
            if acked > 0:
                why = "an acknowledgement completed elsewhere"
                break
        if store_ok and n == len(peers) - 1 and now - last_change >= REPAIR_GRACE_S:
            why = "all peers but one answered"
            break
        if now > end:
            why = f"{end - t0:.0f} s passed"
            break
        time.sleep(0.01)
    with lock:
        answers = {p: heard.get(p, LOST) for p in peers}
    commit = known == COMMIT or acked > 0 or COMMIT in answers.values()
    decision = COMMIT if commit else ABORT
    silent = [p for p, a in answers.items() if a == LOST]
    note = (f"repair among the inference ranks ({why}): {'committed' if commit else 'kept the previous weights'}"
            f" (here: {KNOWS[known]}; " + ", ".join(f"rank {p} {KNOWS.get(a, 'lost')}" for p, a in answers.items())
            + ")" + (f"; not heard: {silent}" if silent else ""))
    return decision, answers, note


def decide(codes: list[int], train_world: int, step: int, mine: list[str],
           local_error: BaseException | None) -> None:
    """Raise unless every rank voted OK."""
    bad = [(r, c) for r, c in enumerate(codes) if c != OK]
    if not bad:
        return
    who = ", ".join(
        f"rank {r} ({' '.join(map(str, side_of_global(r, train_world)))}) {_WORDS[c]}"
        for r, c in bad[:8]
    )
    msg = f"refit of step {step} not committed; inference ranks keep their previous weights: {who}"
    if local_error is not None:
        msg += f"; here: {local_error}"
    elif mine:
        msg += "; here: " + "; ".join(mine[:5])
    cls = TransferError if any(c == FAILED for _, c in bad) else VerificationError
    raise cls(msg)


def gather_steps(groups: Groups, extra: int, mine: int | None) -> tuple[list[int], list[int | None]]:
    """One SUM all-reduce of a [2, world] vector: per rank ``extra`` (a readiness flag) and its
    committed step (None = none yet). Returns both rows."""
    env = groups.env
    v = torch.zeros(2, env.world_size, dtype=torch.int64)
    v[0, env.global_rank] = extra
    v[1, env.global_rank] = 0 if mine is None else mine + 1
    _all_reduce(groups, v, dist.ReduceOp.SUM, f"rank {env.global_rank}: the common start")
    return [int(x) for x in v[0].tolist()], [None if x == 0 else int(x) - 1 for x in v[1].tolist()]


def agree(steps: list[int | None], train_world: int) -> tuple[int | None, list[int]]:
    """The inference ranks' common committed step (the lowest) and the ranks ahead of it."""
    infer = [(r, s) for r, s in enumerate(steps) if not is_trainer(r, train_world)]
    known = [s for _, s in infer if s is not None]
    if not known:
        return None, []
    low = None if len(known) < len(infer) else min(known)  # a rank with nothing committed is the lowest
    return low, [r for r, s in infer if s is not None and (low is None or s > low)]
