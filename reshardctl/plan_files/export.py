"""Writing plan outputs, all-or-nothing: ``--out DIR`` (plan files + plan.json) and ``--export-transfers``
(one JSON line per transfer, for independent checking; format in docs/plan-format.md)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from reshardctl.atomic_write import StagedWrites
from reshardctl.errors import OutputError
from reshardctl.plan.refit_plan import Plan
from reshardctl.topology import infer_rank_of, side_of_global


def _region(box) -> list[list[int]]:
    return [[int(a), int(b)] for a, b in box]


def transfer_lines(plan: Plan):
    """The ``--export-transfers`` lines (dicts) of one plan, streamed in execution order."""
    names = [t.name for t in plan.model.tensors]
    T = plan.train_world
    for inst, src, dst, box, nb, stage in plan.iter_transfers():
        src_side, src_side_rank = side_of_global(src, T)
        yield {"op": "p2p", "tensor": names[inst], "src": src, "dst": dst,
               "src_side": src_side, "src_side_rank": src_side_rank,
               "dst_side_rank": infer_rank_of(dst, T), "stage": stage, "region": _region(box), "bytes": nb}
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
                   "src_side": "train", "src_side_rank": b.root, "dst_side_rank": [infer_rank_of(r, T) for r in receivers],
                   "region": [[0, n] for n in t.shape], "bytes": t.nbytes}


def _write_lines(plan: Plan, f) -> int:
    n = 0
    for line in transfer_lines(plan):
        f.write(json.dumps(line, separators=(",", ":")))
        f.write("\n")
        n += 1
    return n


@contextmanager
def _output_errors(flag: str, path: str | os.PathLike):
    try:
        yield
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write: {e.strerror or e}", hint="choose a path in an existing, writable directory") from None


def _write_files(d: Path, plans: dict[str, Plan], result: dict, file_for,
                 extra: dict[str, str | bytes] | None = None) -> list[tuple[Path, str]]:
    """Write every output file for directory ``d`` to ``file_for(final path)``; return (written, final name).
    ``extra``: more files by relative name (``slurm/hetjob.sbatch``), text or bytes. Private to the user:
    files 0600, subdirectories 0700 (``session.pkl`` holds the run token and is unpickled by the ranks)."""
    from reshardctl.plan_files.serialize import save_plan

    done = []
    for t, p in plans.items():
        name = f"plan-{t}.npz"
        done.append((save_plan(p, file_for(d / name)), name))
    js = file_for(d / "plan.json")
    js.write_text(json.dumps(result, indent=2, default=str) + "\n")
    done.append((js, "plan.json"))
    for name, content in (extra or {}).items():
        (d / name).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        f = file_for(d / name)
        if isinstance(content, bytes):
            f.write_bytes(content)
        else:
            f.write_text(content)
        done.append((f, name))
    for f, _ in done:
        f.chmod(PRIVATE_FILE)
    return done


PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700


def _stage_out(staged: StagedWrites, out: Path, plans: dict[str, Plan], result: dict,
               extra: dict[str, str | bytes] | None = None) -> list[Path]:
    """A new DIR (0700) is filled under a temp name next to it; into an existing DIR (the user's own,
    ``inputs.output_problems``) every file goes to a temp name inside it. Returns the final paths (valid
    after ``staged.commit()``)."""
    if not out.exists():
        tmp = staged.dir(out, mode=PRIVATE_DIR)
        files = _write_files(tmp, plans, result, lambda p: p, extra)
    else:
        files = _write_files(out, plans, result, lambda p: staged.file(p, mode=PRIVATE_FILE), extra)
    return [out / name for _, name in files]


def _remove_stale(out: Path, written: list[Path]) -> None:
    names = {p.name for p in written}
    for stale in out.glob("plan-*.npz"):  # plans of transports this run did not plan: not ours any more
        if stale.name not in names:
            stale.unlink(missing_ok=True)


def _make_parents(path: Path, created: list[Path]) -> None:
    """Create the missing parent directories of ``path`` (like ``mkdir -p``), recording each one created
    so that a failed command can remove them again."""
    missing = [p for p in path.absolute().parents if not p.exists()]
    for p in reversed(missing):
        p.mkdir()
        created.append(p)


def write_outputs(plans: dict[str, Plan], result: dict, *, out: str | os.PathLike | None = None,
                  export: str | os.PathLike | None = None, export_plan: Plan | None = None,
                  extra: dict[str, str | bytes] | None = None) -> tuple[list[Path], int | None]:
    """``--out DIR`` and ``--export-transfers FILE`` together, all-or-nothing across BOTH: everything is
    written under temporary names first and renamed only when every output was written, so a failing
    export leaves no new DIR behind (and vice versa); parent directories created for them are removed
    again on failure. ``--export-transfers -`` streams the lines to stdout once every file is in place.
    A symlink is written through (its target is replaced, the link stays). Returns (DIR's files, export
    line count). ``OutputError`` names the flag and the path that could not be written."""
    paths: list[Path] = []
    n = None
    created: list[Path] = []
    to_stdout = export is not None and str(export) == "-"
    try:
        with StagedWrites() as staged:
            if export is not None and not to_stdout:
                with _output_errors("--export-transfers", export):
                    _make_parents(Path(export), created)
                    with open(staged.file(export), "w") as f:
                        n = _write_lines(export_plan, f)
            if out is not None:
                with _output_errors("--out", out):
                    _make_parents(Path(out), created)
                    paths = _stage_out(staged, Path(out), plans, result, extra)
            with _output_errors("--out" if out is not None else "--export-transfers", out if out is not None else export):
                staged.commit()
    except BaseException:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        raise
    if out is not None and Path(out).is_dir():
        Path(out).chmod(PRIVATE_DIR)  # an existing DIR of the user's own: private from now on
        _remove_stale(Path(out), paths)
    if to_stdout:
        n = _write_lines(export_plan, sys.stdout)
        sys.stdout.flush()
    return paths, n
