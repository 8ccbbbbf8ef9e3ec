"""Many transfer tables at once (a stage's, in ``reshard.schedule_rounds``): every table's staging vector,
every table re-ordered by one permutation, the bytes of each (sender, receiver) pair. One numpy pass per
field over the tables concatenated instead of a few calls per table (a DeepSeek-V3 stage has ~2,500)."""

from __future__ import annotations

import numpy as np

from reshardctl.plan.routing import TransferTable

# a dense [world x world] table of pair bytes up to this many cells (32 MiB of float64), else a sort
DENSE_PAIRS = 1 << 22


def pair_bytes(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (src, dst) pairs of the transfers in ascending ``src * world + dst`` order, and the
    bytes of each (``nbytes`` summed: integer-valued floats, exact in any order)."""
    key = src.astype(np.int64) * world + dst
    if world * world <= DENSE_PAIRS:
        table = np.bincount(key, weights=nbytes, minlength=world * world)
        hit = np.flatnonzero(np.bincount(key, minlength=world * world))
        psrc, pdst = np.divmod(hit, world)
        return psrc, pdst, table[hit]
    order = np.argsort(key)
    key = key[order]
    cut = np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1]
    psrc, pdst = np.divmod(key[cut], world)
    return psrc, pdst, np.add.reduceat(nbytes[order], cut)


def staging_vectors(tables: list[TransferTable], world: int) -> list[np.ndarray]:
    """Per table, the bytes each rank packs + receives for one instance ([world] int64), a batch of
    tables per ``bincount`` (at most ``DENSE_PAIRS`` counts at a time): rows of one matrix per batch."""
    out: list[np.ndarray] = []
    step = max(1, DENSE_PAIRS // max(world, 1))
    for a in range(0, len(tables), step):
        batch = tables[a:a + step]
        lens = [len(t) for t in batch]
        at = np.repeat(np.arange(len(batch), dtype=np.int64) * world, lens)
        nb = np.concatenate([t.nbytes for t in batch])
        m = len(batch) * world
        vec = (np.bincount(at + np.concatenate([t.src for t in batch]), weights=nb, minlength=m)
               + np.bincount(at + np.concatenate([t.dst for t in batch]), weights=nb, minlength=m))
        out.extend(vec.astype(np.int64).reshape(len(batch), world))
    return out


def reordered(tables: list[TransferTable], order: np.ndarray, lens: np.ndarray) -> list[TransferTable]:
    """Each table's rows permuted: ``order`` is a permutation of the tables' concatenated rows that keeps
    every table's rows in its own block (``reshard._phase_order``). One gather per field over all the tables
    (boxes per number of dims), each result cut back into per-table views: the same tables as
    ``table.take(order[a:z] - a)`` one by one."""
    if not tables:
        return []
    starts = np.cumsum(lens) - lens
    bounds = np.r_[starts, starts[-1] + lens[-1]].tolist()
    flat = {f: np.concatenate([getattr(t, f) for t in tables])[order] for f in ("src", "dst", "stage", "nbytes")}
    cols = {f: [flat[f][a:z] for a, z in zip(bounds[:-1], bounds[1:])] for f in flat}
    ndims = np.fromiter((t.lo.shape[1] for t in tables), dtype=np.int64, count=len(tables))
    boxes: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(tables)
    for d in sorted(set(ndims.tolist())):
        which = np.flatnonzero(ndims == d)
        # rows of this group, in order, as positions in the group's own concatenation
        w_lens = lens[which]
        w_start = np.cumsum(w_lens) - w_lens
        rows = np.concatenate([order[bounds[k]:bounds[k + 1]] for k in which.tolist()])
        local = rows - np.repeat(starts[which] - w_start, w_lens)
        lo = np.take(np.concatenate([tables[k].lo for k in which.tolist()]), local, axis=0)
        hi = np.take(np.concatenate([tables[k].hi for k in which.tolist()]), local, axis=0)
        for k, a, z in zip(which.tolist(), w_start.tolist(), (w_start + w_lens).tolist()):
            boxes[k] = (lo[a:z], hi[a:z])
    return [TransferTable(cols["src"][k], cols["dst"][k], cols["stage"][k], boxes[k][0], boxes[k][1], cols["nbytes"][k])
            for k in range(len(tables))]
