"""An independent checker of a ``Plan``: it only reads the plan's public per-rank views (``steps_for``,
``src_holdings``, ``dst_holdings``, the layouts' placements and the topology), never the planner's
internals (pairs / routing / rounds tables), and simulates the executed schedule.

``check_plan(plan)`` raises ``PlanCheckError`` (an ``AssertionError``) on the first violation and
returns a ``CheckReport`` with byte counts it computed itself:

* pairing: in every round, what rank a sends to b is what b expects from a (same regions, same
  order, same sizes); stage 1 goes trainer -> inference, stage 2 inference -> inference;
* exact coverage: every element of every inference rank's holding is written exactly once (numpy
  count arrays per (inference rank, tensor, box)); stage-1 regions are read from a box the trainer
  rank holds; stage-2 regions from a box the relay holds and received in an earlier stage-1 round;
* byte conservation: region nbytes == numel * itemsize; bytes received per inference rank == the
  bytes of its holding;
* staging: per round and rank, send + receive bytes <= ``plan.bucket_bytes``;
* broadcast buckets: the gather pieces cover each tensor of the bucket exactly once, from trainer
  ranks that hold them; nbytes = sum of the tensors' bytes; the group is the root and every
  inference rank; a bucket <= bucket_bytes / 2 (two are in flight) unless it is a single larger tensor;
* replay: synthetic global tensors (``torch.arange`` based), trainer ranks copy their own boxes,
  messages are packed in region order and unpacked by the receiver with *its* region list, and at
  the end every inference box equals the slice of the global tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from reshardctl.plan.schedule import BroadcastBucket, P2PRound


class PlanCheckError(AssertionError):
    pass


def fail(msg: str) -> None:
    raise PlanCheckError(msg)


@dataclass
class CheckReport:
    rounds: int = 0
    buckets: int = 0
    p2p_bytes: int = 0
    bytes_by_link: dict = field(default_factory=lambda: {"intra_node": 0, "intra_domain": 0, "cross_domain": 0})
    recv_bytes: dict = field(default_factory=dict)  # inference global rank -> bytes written into it
    max_staging: int = 0


def _slices(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def _numel(box) -> int:
    n = 1
    for a, b in box:
        n *= max(0, b - a)
    return n


def _contains(outer, inner) -> bool:
    return len(outer) == len(inner) and all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def _rel(outer, inner) -> tuple[slice, ...]:
    """Slices of ``inner`` relative to the origin of ``outer``."""
    return tuple(slice(c - a, d - a) for (a, _), (c, d) in zip(outer, inner))


def global_tensor(index: int, shape: tuple[int, ...]) -> np.ndarray:
    """Synthetic source data: every element of every tensor distinct."""
    n = int(np.prod(shape)) if shape else 1
    return (torch.arange(n, dtype=torch.int64) + (index + 1) * 10**9).reshape(shape).numpy()


def link_of(topo, a: int, b: int) -> str:
    if topo.node_of[a] == topo.node_of[b]:
        return "intra_node"
    if topo.domain_of[a] == topo.domain_of[b]:
        return "intra_domain"
    return "cross_domain"


def check_plan(plan, *, replay: bool = True, hybrid_roles=None) -> CheckReport:
    topo = plan.topology
    T, I, W = topo.train_world, topo.infer_world, topo.world
    model = plan.model
    tensors = model.tensors
    bound = plan.bucket_bytes
    rep = CheckReport()

    # ---- holdings (from the layouts' public views) -------------------------------------------
    src_hold = {r: plan.src_holdings(r) for r in range(T)}
    dst_hold = {q: plan.dst_holdings(q) for q in range(I)}
    for i, t in enumerate(tensors):
        if plan.train.placement(i).template.shape != t.shape:
            fail(f"{t.name}: trainer template shape != tensor shape")

    # per inference rank: tensor -> list of [box, data, count, write_round, write_stage]
    G = {i: global_tensor(i, t.shape) for i, t in enumerate(tensors)} if replay else {}
    dst_buf: dict[int, dict[int, list[list]]] = {}
    for q in range(I):
        per = {}
        for i, boxes in dst_hold[q].items():
            per[i] = [
                [
                    b,
                    np.full(tuple(hi - lo for lo, hi in b), -1, dtype=np.int64),
                    np.zeros(tuple(hi - lo for lo, hi in b), dtype=np.int32),
                    np.full(tuple(hi - lo for lo, hi in b), -1, dtype=np.int64),
                    np.zeros(tuple(hi - lo for lo, hi in b), dtype=np.int8),
                ]
                for b in boxes
            ]
        dst_buf[T + q] = per

    def dst_entry(g: int, reg):
        for ent in dst_buf[g].get(reg.tensor, ()):
            if _contains(ent[0], reg.box):
                return ent
        fail(f"rank {g} receives/forwards {tensors[reg.tensor].name}{list(reg.box)} outside its holding "
             f"{dst_hold[g - T].get(reg.tensor, ())}")

    def check_region(reg, where: str) -> None:
        if not (0 <= reg.tensor < len(tensors)):
            fail(f"{where}: bad tensor index {reg.tensor}")
        t = tensors[reg.tensor]
        if len(reg.box) != len(t.shape):
            fail(f"{where}: box {reg.box} has wrong rank for {t.name}{t.shape}")
        for (a, b), n in zip(reg.box, t.shape):
            if not (0 <= a < b <= n):
                fail(f"{where}: box {reg.box} empty or outside {t.name}{t.shape}")
        if reg.nbytes != _numel(reg.box) * t.itemsize:
            fail(f"{where}: {t.name}{list(reg.box)} nbytes {reg.nbytes} != numel*itemsize "
                 f"{_numel(reg.box) * t.itemsize}")

    # ---- per-rank step lists -----------------------------------------------------------------
    rounds: dict[int, dict[int, P2PRound]] = {}
    buckets: dict[int, BroadcastBucket] = {}
    bucket_members: dict[int, set[int]] = {}
    for r in range(W):
        last = -1
        for s in plan.steps_for(r):
            if s.index <= last:
                fail(f"rank {r}: step indices not increasing ({last} then {s.index})")
            last = s.index
            if isinstance(s, P2PRound):
                if not s.sends and not s.recvs:
                    fail(f"rank {r}: empty round {s.index}")
                peers_s = [p.peer for p in s.sends]
                peers_r = [p.peer for p in s.recvs]
                if len(set(peers_s)) != len(peers_s) or len(set(peers_r)) != len(peers_r):
                    fail(f"rank {r} round {s.index}: a peer appears twice")
                if s.staging_bytes > bound:
                    fail(f"rank {r} round {s.index}: staging {s.staging_bytes} > bucket {bound}")
                rep.max_staging = max(rep.max_staging, s.staging_bytes)
                rounds.setdefault(s.index, {})[r] = s
            elif isinstance(s, BroadcastBucket):
                if s.index in buckets and buckets[s.index] != s:
                    fail(f"bucket {s.index} differs between ranks")
                buckets[s.index] = s
                bucket_members.setdefault(s.index, set()).add(r)
            else:
                fail(f"rank {r}: unknown step {s!r}")
    if set(rounds) & set(buckets):
        fail("a step index is both a round and a bucket")
    rep.rounds, rep.buckets = len(rounds), len(buckets)
    if plan.transport == "reshard" and buckets:
        fail("reshard plan has broadcast buckets")
    if plan.transport == "gather_broadcast" and rounds:
        fail("gather_broadcast plan has p2p rounds")

    # ---- rounds: stage and pairing ------------------------------------------------------------
    for idx, per_rank in rounds.items():
        stages = {s.stage for s in per_rank.values()}
        if len(stages) != 1 or stages - {1, 2}:
            fail(f"round {idx}: stages {stages}")
        stage = stages.pop()
        for a, s in per_rank.items():
            for pr in s.sends:
                b = pr.peer
                if stage == 1 and not (a < T <= b < W):
                    fail(f"round {idx} (stage 1): {a} -> {b} is not trainer -> inference")
                if stage == 2 and not (T <= a < W and T <= b < W and a != b):
                    fail(f"round {idx} (stage 2): {a} -> {b} is not inference -> inference")
                other = per_rank.get(b)
                theirs = [p for p in other.recvs if p.peer == a] if other else []
                if not theirs:
                    fail(f"round {idx}: {a} sends {pr.nbytes} bytes to {b}, which expects nothing from it")
                if theirs[0].regions != pr.regions:
                    fail(f"round {idx}: {a} -> {b} regions differ: sender {pr.regions} receiver {theirs[0].regions}")
                for reg in pr.regions:
                    check_region(reg, f"round {idx} {a}->{b}")
                if hybrid_roles is not None:
                    for reg in pr.regions:
                        if tensors[reg.tensor].role not in hybrid_roles:
                            fail(f"hybrid: {tensors[reg.tensor].name} ({tensors[reg.tensor].role}) resharded")
                rep.p2p_bytes += pr.nbytes
                rep.bytes_by_link[link_of(topo, a, b)] += pr.nbytes
            for pr in s.recvs:
                other = per_rank.get(pr.peer)
                if not other or not any(p.peer == a for p in other.sends):
                    fail(f"round {idx}: {a} expects {pr.nbytes} bytes from {pr.peer}, which sends nothing to it")

    # ---- buckets: static checks ---------------------------------------------------------------
    in_bucket: dict[int, int] = {}
    infer_ranks = set(range(T, W))
    for idx, b in buckets.items():
        if not (0 <= b.root < T):
            fail(f"bucket {idx}: root {b.root} is not a trainer rank")
        if b.group[0] != b.root or len(set(b.group)) != len(b.group) or set(b.group[1:]) != infer_ranks:
            fail(f"bucket {idx}: group {b.group} is not (root, every inference rank)")
        expected_members = set(b.group) | {g.peer for g in b.gather}
        if bucket_members[idx] != expected_members:
            fail(f"bucket {idx}: listed on ranks {sorted(bucket_members[idx])}, takes part {sorted(expected_members)}")
        if not b.tensors:
            fail(f"bucket {idx}: no tensors")
        size = sum(tensors[i].nbytes for i in b.tensors)
        if b.nbytes != size:
            fail(f"bucket {idx}: nbytes {b.nbytes} != sum of tensor bytes {size}")
        if size > bound // 2 and len(b.tensors) > 1:
            fail(f"bucket {idx}: {size} bytes > half the staging bound {bound} with {len(b.tensors)} tensors")
        for i in b.tensors:
            if i in in_bucket:
                fail(f"{tensors[i].name} in buckets {in_bucket[i]} and {idx}")
            in_bucket[i] = idx
            if hybrid_roles is not None and tensors[i].role in hybrid_roles:
                fail(f"hybrid: {tensors[i].name} ({tensors[i].role}) broadcast")
        if len({g.peer for g in b.gather}) != len(b.gather):
            fail(f"bucket {idx}: a gather peer appears twice")
        cover = {i: np.zeros(tensors[i].shape, dtype=np.int32) for i in b.tensors}
        for g in b.gather:
            if not (0 <= g.peer < T):
                fail(f"bucket {idx}: gather peer {g.peer} is not a trainer rank")
            for reg in g.regions:
                check_region(reg, f"bucket {idx} gather from {g.peer}")
                if reg.tensor not in cover:
                    fail(f"bucket {idx}: gathers {tensors[reg.tensor].name}, not in the bucket")
                if not any(_contains(h, reg.box) for h in src_hold[g.peer].get(reg.tensor, ())):
                    fail(f"bucket {idx}: rank {g.peer} does not hold {tensors[reg.tensor].name}{list(reg.box)}")
                cover[reg.tensor][_slices(reg.box)] += 1
        for i, c in cover.items():
            if not (c == 1).all():
                fail(f"bucket {idx}: gather covers {tensors[i].name} {int((c == 0).sum())} elements 0 times, "
                     f"{int((c > 1).sum())} elements more than once")

    # ---- simulate in step order ---------------------------------------------------------------
    for idx in sorted(set(rounds) | set(buckets)):
        if idx in rounds:
            per_rank = rounds[idx]
            stage = next(iter(per_rank.values())).stage
            msgs: dict[tuple[int, int], np.ndarray] = {}
            for a, s in sorted(per_rank.items()):  # pack every send first (reads see the state before the round)
                for pr in s.sends:
                    parts = []
                    for reg in pr.regions:
                        if stage == 1:
                            box = next((h for h in src_hold[a].get(reg.tensor, ()) if _contains(h, reg.box)), None)
                            if box is None:
                                fail(f"round {idx}: trainer rank {a} sends {tensors[reg.tensor].name}{list(reg.box)} "
                                     f"it does not hold (holds {src_hold[a].get(reg.tensor, ())})")
                            if replay:
                                parts.append(G[reg.tensor][_slices(reg.box)].ravel())
                        else:
                            ent = dst_entry(a, reg)
                            sl = _rel(ent[0], reg.box)
                            cnt, wr, ws = ent[2][sl], ent[3][sl], ent[4][sl]
                            if not ((cnt == 1).all() and (ws == 1).all() and (wr < idx).all()):
                                fail(f"round {idx}: relay {a} forwards {tensors[reg.tensor].name}{list(reg.box)} "
                                     f"it has not received in an earlier stage-1 round")
                            parts.append(ent[1][sl].ravel())
                    if replay or stage == 2:
                        msgs[(a, pr.peer)] = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            for b, s in sorted(per_rank.items()):
                for pr in s.recvs:
                    buf = msgs.get((pr.peer, b)) if (replay or stage == 2) else None
                    off = 0
                    for reg in pr.regions:
                        ent = dst_entry(b, reg)
                        sl = _rel(ent[0], reg.box)
                        n = _numel(reg.box)
                        if buf is not None:
                            if off + n > buf.size:
                                fail(f"round {idx}: {pr.peer}->{b} message too short")
                            ent[1][sl] = buf[off : off + n].reshape(tuple(d - c for c, d in reg.box))
                        off += n
                        ent[2][sl] += 1
                        ent[3][sl] = idx
                        ent[4][sl] = stage
                        rep.recv_bytes[b] = rep.recv_bytes.get(b, 0) + reg.nbytes
                    if buf is not None and off != buf.size:
                        fail(f"round {idx}: {pr.peer}->{b} sent {buf.size} elements, receiver unpacked {off}")
        else:
            b = buckets[idx]
            full = {i: np.full(tensors[i].shape, -1, dtype=np.int64) for i in b.tensors} if replay else {}
            if replay:
                for g in b.gather:
                    for reg in g.regions:
                        full[reg.tensor][_slices(reg.box)] = G[reg.tensor][_slices(reg.box)]
            for q in range(T, W):
                for i in b.tensors:
                    for ent in dst_buf[q].get(i, ()):
                        if replay:
                            ent[1][...] = full[i][_slices(ent[0])]
                        ent[2] += 1
                        ent[3][...] = idx
                        ent[4][...] = 3
                        rep.recv_bytes[q] = rep.recv_bytes.get(q, 0) + _numel(ent[0]) * tensors[i].itemsize

    # ---- final: exact coverage, conservation, replayed values --------------------------------
    for q in range(T, W):
        need = 0
        for i, ents in dst_buf[q].items():
            t = tensors[i]
            for box, data, cnt, _, _ in ents:
                need += _numel(box) * t.itemsize
                if not (cnt == 1).all():
                    fail(f"inference rank {q - T} (global {q}): {t.name}{list(box)}: {int((cnt == 0).sum())} "
                         f"elements never written, {int((cnt > 1).sum())} written more than once")
                if replay and not np.array_equal(data, G[i][_slices(box)]):
                    bad = int((data != G[i][_slices(box)]).sum())
                    fail(f"inference rank {q - T}: {t.name}{list(box)}: {bad} elements have wrong values after replay")
        got = rep.recv_bytes.get(q, 0)
        if got != need:
            fail(f"inference rank {q - T}: received {got} bytes, holds {need}")
    return rep


def naive_cross_domain_bytes(model, train, infer, topo) -> int:
    """A naive plan's cross-domain bytes: every destination element from the lowest trainer rank that
    holds it; no topology preference, no relay (element-wise, independent of the planner)."""
    T = topo.train_world
    dom = topo.domain_of
    total = 0
    for i, t in enumerate(model.tensors):
        owner = np.full(t.shape, -1, dtype=np.int64)
        for r in range(T - 1, -1, -1):
            for box in train.placement(i).holding(r):
                owner[_slices(box)] = r
        for q in range(infer.world_size):
            for box in infer.placement(i).holding(q):
                o = owner[_slices(box)]
                assert (o >= 0).all()
                total += int((dom[o] != dom[T + q]).sum()) * t.itemsize
    return total
