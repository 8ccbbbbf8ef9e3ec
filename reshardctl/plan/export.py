"""Writing plan outputs, all-or-nothing: ``--out DIR`` (plan files + plan.json) and ``--export-transfers``
(one JSON line per transfer, for independent checking; format in docs/plan-format.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from reshardctl.atomic_write import atomic_dir, atomic_open, dir_mode  # noqa: F401  (dir_mode: still importable from here)
from reshardctl.plan.model import Plan


def _region(box) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in box]


def transfer_lines(plan: Plan):
    """The ``--export-transfers`` lines (dicts) of one plan, streamed in execution order."""
    names = [t.name for t in plan.model.tensors]
    T = plan.train_world
    for inst, src, dst, box, nb, stage in plan.iter_transfers():
        yield {"op": "p2p", "tensor": names[inst], "src": src, "dst": dst,
               "src_side": "train" if src < T else "infer", "src_side_rank": src if src < T else src - T,
               "dst_side_rank": dst - T, "stage": stage, "region": _region(box), "bytes": nb}
    for b in plan.buckets:
        for pr in b.gather:
            for reg in pr.regions:
                yield {"op": "gather", "bucket": b.index, "tensor": names[reg.tensor], "src": pr.peer, "dst": b.root,
                       "src_side": "train", "src_side_rank": pr.peer, "dst_side_rank": b.root,
                       "region": _region(reg.box), "bytes": reg.nbytes}
        receivers = list(b.group[1:])
        for i in b.tensors:
            t = plan.model.tensors[i]
            yield {"op": "broadcast", "bucket": b.index, "tensor": t.name, "src": b.root, "dst": receivers,
                   "src_side": "train", "src_side_rank": b.root, "dst_side_rank": [r - T for r in receivers],
                   "region": [[0, n] for n in t.shape], "bytes": t.nbytes}


def export_transfers(plan: Plan, path: str | os.PathLike) -> int:
    """Stream the transfer lines into a temp file next to ``path``, then rename. Returns the line count."""
    n = 0
    with atomic_open(path) as f:
        for line in transfer_lines(plan):
            f.write(json.dumps(line, separators=(",", ":")))
            f.write("\n")
            n += 1
    return n


def _write_files(d: Path, plans: dict[str, Plan], result: dict, suffix: str = "") -> list[tuple[Path, str]]:
    """Write every output file into ``d`` (names + ``suffix``); return (written, final name) pairs."""
    from reshardctl.plan.serialize import save_plan

    done = []
    for t, p in plans.items():
        name = f"plan-{t}.npz"
        done.append((save_plan(p, d / (name + suffix)), name))
    js = d / ("plan.json" + suffix)
    js.write_text(json.dumps(result, indent=2, default=str) + "\n")
    done.append((js, "plan.json"))
    return done


def write_out(out: str | os.PathLike, plans: dict[str, Plan], result: dict) -> list[Path]:
    """All-or-nothing: a new DIR is filled under a temp name and renamed; into an existing DIR every file
    is written under a temp name first, then each is renamed over its final name (and ``plan-*.npz`` of
    transports not planned this time are removed, so DIR always matches its plan.json)."""
    out = Path(out)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(out) as tmp:
            files = _write_files(tmp, plans, result)
        return [out / name for _, name in files]
    suffix = f".tmp-{os.getpid()}"
    files: list[tuple[Path, str]] = []
    try:
        files = _write_files(out, plans, result, suffix)
    except BaseException:
        for f in out.glob(f"*{suffix}"):
            f.unlink(missing_ok=True)
        raise
    for tmpf, name in files:
        os.replace(tmpf, out / name)
    written = {name for _, name in files}
    for stale in out.glob("plan-*.npz"):  # plans of transports this run did not plan: not ours any more
        if stale.name not in written:
            stale.unlink(missing_ok=True)
    return [out / name for _, name in files]
