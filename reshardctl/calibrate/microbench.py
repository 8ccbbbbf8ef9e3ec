"""The microbenchmarks, run by every rank of a calibration world (rank 0 reports the results).

World: ``2 x per_node`` ranks standing for two nodes (ranks ``0..per_node-1`` on the first, the rest on
the second), the same placement as a refit's trainer and inference ranks. Every figure is the median
of ``reps`` timed repetitions after one warm-up (first operations on a connection are slow):

* p2p by message size, rank 0 -> rank 1 (inside a node) and rank 0 -> rank ``per_node`` (across):
  one-way seconds per size (half a ping-pong), fitted later as ``latency + bytes / bandwidth``;
* all pairs at once: rank ``i`` -> rank ``per_node + i`` for every ``i``: aggregate bytes/s of a node's links
  (each repetition timed by its slowest rank, the last receiver);
* grouped messages: 1 and ``MANY`` small messages in one ``batch_isend_irecv``: launch and per-message cost;
* broadcast from rank 0 over (0, second node's ranks): delivered bytes/s;
* pack: a strided (column block) copy into a contiguous buffer, on one rank; checksum: ``runtime.checksum``;
  both again on one node's ranks at once (what a refit's senders, then its receivers, get together
  when they share a machine's cores and memory), and the checksum on every rank at once;
* a control round: the runtime's tree all-reduce of every rank, run in a helper thread as the runtime
  runs it;
* landing (``calibrate/landing.py`` ``host_cost``), on rank 0: the host time of landing committed bytes in
  framework parameters, per segment directly (one ``_foreach_copy_``) and per HF tensor through a loader call.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from reshardctl.calibrate.landing import host_cost
from reshardctl.runtime.bounded_wait import start_helper, wait_all
from reshardctl.runtime.control_tree import tree_all_reduce

SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20)
BIG = 32 << 20
MANY = 32
SMALL = 1 << 10


def _sync() -> None:
    dist.barrier()


def _timed(fn, reps: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _timed_slowest(fn, reps: int) -> float:
    """Like ``_timed``, but each repetition's time is the slowest rank's (every rank times its own part,
    then one all-reduce of the times after the last repetition): a pattern whose receivers finish after
    their senders costs a refit's round what its last receiver takes, not what a sender's posts take."""
    fn()
    mine = torch.zeros(reps, dtype=torch.float64)
    for k in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        mine[k] = time.perf_counter() - t0
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return statistics.median(mine.tolist())


def _pingpong(rank: int, a: int, b: int, buf: torch.Tensor, reps: int) -> float:
    """One-way seconds of ``buf`` between ranks a and b (half a round trip); others only sync."""
    def fn() -> None:
        if rank == a:
            dist.send(buf, b)
            dist.recv(buf, b)
        elif rank == b:
            dist.recv(buf, a)
            dist.send(buf, a)
    return _timed(fn, reps) / 2


def run(rank: int, per_node: int, device: torch.device, reps: int = 5) -> dict:
    world = dist.get_world_size()
    res: dict = {"p2p": {"intra_node": [], "cross_node": []}}
    for name, peer in (("intra_node", 1), ("cross_node", per_node)):
        for size in SIZES:
            buf = torch.zeros(size, dtype=torch.uint8, device=device)
            res["p2p"][name].append([size, _pingpong(rank, 0, peer, buf, reps)])
    # every rank of the first node sends to its partner on the second, all at once
    big = torch.zeros(BIG, dtype=torch.uint8, device=device)

    def pairs() -> None:
        peer = rank + per_node if rank < per_node else rank - per_node
        op = dist.P2POp(dist.isend if rank < per_node else dist.irecv, big, peer)
        for w in dist.batch_isend_irecv([op]):
            w.wait()
    t = _timed_slowest(pairs, reps)  # a receiver finishes last: a sender's wait ends as its bytes are queued
    res["aggregate"] = {"pairs": per_node, "bytes": BIG * per_node, "seconds": t}
    # grouped small messages: rank 0 -> rank per_node, 1 and MANY in one batch
    smalls = [torch.zeros(SMALL, dtype=torch.uint8, device=device) for _ in range(MANY)]
    grouped = {}
    for n in (1, MANY):
        def batch(n=n) -> None:
            if rank not in (0, per_node):
                return
            f = dist.isend if rank == 0 else dist.irecv
            ops = [dist.P2POp(f, smalls[k], per_node if rank == 0 else 0) for k in range(n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        grouped[n] = _timed(batch, reps)
    res["grouped"] = {"small_bytes": SMALL, "counts": [1, MANY], "seconds": [grouped[1], grouped[MANY]]}
    members = [0] + list(range(per_node, world))
    group = dist.new_group(members)

    def bcast() -> None:
        if rank in members:
            dist.broadcast(big, src=0, group=group)
    res["broadcast"] = {"receivers": len(members) - 1, "bytes": BIG, "seconds": _timed(bcast, reps)}
    if rank == 0:
        res["copy"] = _copy_rate(device, reps)
        res["checksum"] = _checksum_rate(device, reps)
        res["landing"] = host_cost(device, reps)
    _sync()
    # one node's ranks at once (the other node idle): a refit's senders pack and checksum while its
    # receivers wait, then the receivers unpack and checksum; ranks sharing cores get this much together
    copy, _ = _copy_fn(device)
    res["copy_side"] = {"ranks": per_node, "bytes": BIG * per_node,
                        "seconds": _together(copy if rank < per_node else (lambda: None), reps)}
    summ = _checksum_fn(device)
    res["checksum_side"] = {"ranks": per_node, "bytes": BIG * per_node,
                            "seconds": _together(summ if rank < per_node else (lambda: None), reps)}
    # every rank at once: a refit's verify phase, where senders sum what they sent in place while
    # receivers sum what landed
    res["checksum_world"] = {"ranks": world, "bytes": BIG * world, "seconds": _together(summ, reps)}
    # one control round, every rank at once: the all-reduce a refit's vote and acknowledgement are (the
    # runtime's tree), every step waited the way the runtime waits (in a helper thread, runtime/groups.py)
    votes = torch.zeros(world, dtype=torch.int64)
    res["control"] = {"ranks": world, "seconds": _timed(lambda: in_helper_thread(
        lambda: tree_all_reduce(votes, torch.minimum, rank=rank, world=world, group=None, wait=wait_all)), reps)}
    return res


def in_helper_thread(job) -> None:
    """``job()`` in a helper thread while this one waits for it, as ``run_bounded`` runs it."""
    done, err = start_helper(job)
    done.wait()
    if err:
        raise err[0]


def _together(fn, reps: int) -> float:
    """Median seconds from a common start until the last rank has run ``fn`` once."""
    out = []
    fn()
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _copy_fn(device: torch.device):
    """A column block (half the columns) of a row-major matrix into a contiguous buffer: the strided
    copy a packed message or an unpack does."""
    rows = 4096
    src = torch.zeros((rows, 2 * BIG // rows), dtype=torch.uint8, device=device)
    dst = torch.empty((rows, BIG // rows), dtype=torch.uint8, device=device)

    def fn() -> None:
        dst.copy_(src[:, : BIG // rows])
        _wait(device)
    return fn, (src, dst)


def _checksum_fn(device: torch.device):
    from reshardctl.runtime.checksum import checksum

    buf = torch.randint(0, 255, (BIG,), dtype=torch.uint8, device=device)
    return lambda: checksum(buf)[0].item()  # .item(): the value is on the host (a GPU is done)


def _median_time(fn, reps: int) -> dict:
    """``fn`` once to warm up, then the median of ``reps`` timed calls, for ``BIG`` bytes."""
    out = []
    fn()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return {"bytes": BIG, "seconds": statistics.median(out)}


def _copy_rate(device: torch.device, reps: int) -> dict:
    return _median_time(_copy_fn(device)[0], reps)


def _checksum_rate(device: torch.device, reps: int) -> dict:
    """The checksum's rate on one rank, and the path it took (runtime/checksum_choice.py)."""
    from reshardctl.runtime.checksum import path_for

    return {**_median_time(_checksum_fn(device), reps), "path": path_for(device)}
