"""Hand-made plans for the runtime tests (a brute-force stand-in for the planner)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict

from reshardctl.layout.indexset import intersect_boxes
from reshardctl.layout.placement import box_numel
from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec
from reshardctl.plan.schedule import BroadcastBucket, P2PRound, PeerRegions, Region
from reshardctl.runtime.contract import StaticPlan

DIMS = ModelDims(arch="llama", hidden=8, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, vocab=16,
                 intermediate=16)


def model(tensors: list[tuple[str, tuple[int, ...], str]]) -> ModelSpec:
    return ModelSpec("hand", DIMS, tuple(TensorSpec(n, s, d, "ffn", "mlp_up") for n, s, d in tensors))


_inter = intersect_boxes


def _fp(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def p2p_plan(m: ModelSpec, src: dict, dst: dict, *, per_tensor_rounds: bool = False,
             relay: dict[int, int] | None = None, bucket_bytes: int = 1 << 30) -> StaticPlan:
    """src: train rank -> {tensor: boxes}; dst: infer rank -> {tensor: boxes}.
    relay: infer rank -> infer rank it gets everything from in a stage-2 round (identical holdings)."""
    T, I = len(src), len(dst)
    relay = relay or {}
    # (round, sender, receiver) -> regions
    msgs: dict[tuple[int, int, int], list[Region]] = defaultdict(list)
    for d, held in dst.items():
        if d in relay:
            continue
        for ti, boxes in held.items():
            rnd = ti if per_tensor_rounds else 0
            for db in boxes:
                for s, sheld in src.items():
                    for sb in sheld.get(ti, ()):
                        it = _inter(db, sb) if db else ()
                        if it is None:
                            continue
                        msgs[(rnd, s, T + d)].append(Region(ti, it, box_numel(it) * m.tensors[ti].itemsize))
    last = max((k[0] for k in msgs), default=0)
    for d, r in relay.items():
        assert dst[d] == dst[r]
        for ti, boxes in dst[d].items():
            for db in boxes:
                msgs[(last + 1, T + r, T + d)].append(Region(ti, db, box_numel(db) * m.tensors[ti].itemsize))
    steps: dict[int, list] = defaultdict(list)
    for rnd in sorted({k[0] for k in msgs}):
        stage = 2 if relay and rnd == last + 1 else 1
        for rank in range(T + I):
            sends = tuple(PeerRegions(r, tuple(v)) for (k, s, r), v in sorted(msgs.items()) if k == rnd and s == rank)
            recvs = tuple(PeerRegions(s, tuple(v)) for (k, s, r), v in sorted(msgs.items()) if k == rnd and r == rank)
            if sends or recvs:
                steps[rank].append(P2PRound(rnd, stage, sends, recvs))
    return StaticPlan(m, T, I, "reshard", _fp(m.tensors, src, dst, relay, per_tensor_rounds), bucket_bytes,
                      {r: tuple(v) for r, v in steps.items()}, src, dst)


def bucket_plan(m: ModelSpec, src: dict, dst: dict, buckets: list[list[int]], root: int = 0,
                span: str = "root") -> StaticPlan:
    """``span="stage"``: every trainer rank is in the broadcast group (as on GPU sites)."""
    T, I = len(src), len(dst)
    steps: dict[int, list] = defaultdict(list)
    trainers = tuple(r for r in range(T) if r != root) if span == "stage" else ()
    group = (root,) + trainers + tuple(range(T, T + I))
    for k, tensors in enumerate(buckets):
        gather = []
        for s in range(T):
            regs = tuple(Region(ti, b, box_numel(b) * m.tensors[ti].itemsize)
                         for ti in tensors for b in src[s].get(ti, ()))
            if regs:
                gather.append(PeerRegions(s, regs))
        nbytes = sum(m.tensors[t].nbytes for t in tensors)
        step = BroadcastBucket(k, root, group, tuple(tensors), tuple(gather), nbytes)
        for r in sorted(set(group) | {g.peer for g in gather}):
            steps[r].append(step)
    bucket_bytes = max(sum(m.tensors[t].nbytes for t in b) for b in buckets)
    return StaticPlan(m, T, I, "gather_broadcast", _fp(m.tensors, src, dst, buckets), bucket_bytes,
                      {r: tuple(v) for r, v in steps.items()}, src, dst)


def rows_cols_case():
    """2 trainers hold row halves, 2 inference ranks hold column halves (uneven), plus odd extras."""
    m = model([
        ("w.a", (7, 10), "bfloat16"),        # uneven rows / cols
        ("w.b", (6, 5), "float8_e4m3fn"),    # odd byte widths -> alignment padding
        ("w.c", (4, 3, 2), "float32"),       # 3-d
        ("norm", (5,), "float32"),           # held by trainer 0 only, replicated on both inference ranks
    ])
    src = {
        0: {0: (((0, 4), (0, 10)),), 1: (((0, 3), (0, 5)),), 2: (((0, 1), (0, 3), (0, 2)),), 3: (((0, 5),),)},
        1: {0: (((4, 7), (0, 10)),), 1: (((3, 6), (0, 5)),), 2: (((1, 4), (0, 3), (0, 2)),)},
    }
    dst = {
        0: {0: (((0, 7), (0, 6)),), 1: (((0, 6), (0, 2)),), 2: (((0, 4), (0, 3), (0, 1)),), 3: (((0, 5),),)},
        1: {0: (((0, 7), (6, 10)),), 1: (((0, 6), (2, 5)),), 2: (((0, 4), (0, 3), (1, 2)),), 3: (((0, 5),),)},
    }
    return m, src, dst


def relay_case():
    """2 trainers (row halves) -> inference 0 and 1 (column halves, stage 1); 2 and 3 replicate 0 and 1
    and get their weights from them in a stage-2 round. Inference 0 holds two boxes of w.a."""
    m = model([("w.a", (8, 6), "bfloat16"), ("w.b", (4, 4), "float32")])
    src = {0: {0: (((0, 4), (0, 6)),), 1: (((0, 4), (0, 2)),)}, 1: {0: (((4, 8), (0, 6)),), 1: (((0, 4), (2, 4)),)}}
    d0 = {0: (((0, 3), (0, 3)), ((3, 8), (0, 3))), 1: (((0, 4), (0, 4)),)}
    d1 = {0: (((0, 8), (3, 6)),), 1: (((0, 4), (0, 4)),)}
    dst = {0: d0, 1: d1, 2: dict(d0), 3: dict(d1)}
    return m, src, dst, {2: 0, 3: 1}


def big_case(total_mb: int = 256, train: int = 4, infer: int = 4, tensors: int = 4):
    """``tensors`` bf16 matrices of ``total_mb`` MB in all; trainers hold row blocks, inference column blocks."""
    rows = 4096
    cols = total_mb * (1 << 20) // (tensors * rows * 2)
    m = model([(f"layer.{k}.w", (rows, cols), "bfloat16") for k in range(tensors)])
    src = {s: {k: (((s * rows // train, (s + 1) * rows // train), (0, cols)),) for k in range(tensors)}
           for s in range(train)}
    dst = {d: {k: (((0, rows), (d * cols // infer, (d + 1) * cols // infer)),) for k in range(tensors)}
           for d in range(infer)}
    return m, src, dst


def zero_copy_case():
    """2 trainers -> 2 inference ranks where regions are contiguous on both sides (w.eq: same row split),
    on the sender only (w.sc: trainers hold column halves, inference row halves), on the receiver only
    (w.rc: trainers hold row halves, inference column halves), plus w.odd (fp8) with a region contiguous
    on neither side (always packed)."""
    m = model([
        ("w.eq", (8, 6), "bfloat16"),
        ("w.sc", (6, 4), "float32"),
        ("w.rc", (6, 4), "float32"),
        ("w.odd", (5, 3), "float8_e4m3fn"),
    ])
    src = {
        0: {0: (((0, 4), (0, 6)),), 1: (((0, 6), (0, 2)),), 2: (((0, 3), (0, 4)),), 3: (((0, 5), (0, 2)),)},
        1: {0: (((4, 8), (0, 6)),), 1: (((0, 6), (2, 4)),), 2: (((3, 6), (0, 4)),), 3: (((0, 5), (2, 3)),)},
    }
    dst = {
        0: {0: (((0, 4), (0, 6)),), 1: (((0, 3), (0, 4)),), 2: (((0, 6), (0, 2)),), 3: (((0, 5), (1, 3)),)},
        1: {0: (((4, 8), (0, 6)),), 1: (((3, 6), (0, 4)),), 2: (((0, 6), (2, 4)),), 3: (((0, 5), (0, 1)),)},
    }
    return m, src, dst


def row_bucket_case():
    """2 trainers hold row halves of three equal tensors: every gather piece is a row block, contiguous
    in the root's bucket (and a whole box on the sender)."""
    m = model([(f"w.{k}", (16, 8), "float32") for k in range(3)])
    src = {s: {k: (((8 * s, 8 * s + 8), (0, 8)),) for k in range(3)} for s in range(2)}
    dst = {d: {k: (((0, 16), (4 * d, 4 * d + 4)),) for k in range(3)} for d in range(2)}
    return m, src, dst


def alternating_plan() -> StaticPlan:
    """Buckets 0..3 rooted alternately at trainer 0 and trainer 1: groups (0, 2, 3) and (1, 2, 3)."""
    m, src, dst = rows_cols_case()
    a = bucket_plan(m, src, dst, [[0], [2]], root=0)
    b = bucket_plan(m, src, dst, [[1], [3]], root=1)
    steps = {}
    for r in range(4):
        merged = [x for pair in zip(a.steps_for(r), b.steps_for(r)) for x in pair] or a.steps_for(r) or b.steps_for(r)
        steps[r] = tuple(dataclasses.replace(s, index=k) for k, s in enumerate(merged))
    return dataclasses.replace(a, steps=steps, fingerprint=a.fingerprint + "-alt")
