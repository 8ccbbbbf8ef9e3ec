"""One rank of a calibration world started by a launcher (``reshardctl calibrate`` through Slurm).

    python -m reshardctl.calibrate.worker --spec RUN_DIR/calibrate.json

The rank, the world and the rendezvous come from the environment (``runtime/env.py``: the two sides of a
het job are the two stand-in nodes of ``microbench.py``); the spec gives the ranks per node and the
repetitions. The spec is read only when it is this user's alone (``runtime/trusted_file.py``: owned by the
user, in a directory of the user's, writable by nobody else; exit 2 otherwise, nothing measured). Each rank writes ``results/rank-<N>.json`` (rank 0's holds the measurements); exit 0 on
success.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from reshardctl.atomic_write import write_json_atomic
from reshardctl.bounded_load import loads_json
from reshardctl.errors import ReshardError
from reshardctl.runtime.env import read_rank_env
from reshardctl.runtime.trusted_file import read_trusted

MAX_SPEC_BYTES = 1 << 20  # calibrate.json


def _versions(backend: str) -> dict:
    from reshardctl import __version__

    v = {"reshardctl": __version__, "torch": torch.__version__, "python": platform.python_version(), "backend": backend}
    if backend == "nccl":
        v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reshardctl.calibrate.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="calibrate.json written by the launcher")
    a = ap.parse_args(argv)
    try:
        # the launcher's own file, checked as a rank's session file is (runtime/trusted_file.py): owned by
        # this user, in a directory of this user's, writable by nobody else; a regular file, bounded
        spec = loads_json(read_trusted(a.spec, "calibration spec", max_bytes=MAX_SPEC_BYTES))
        if not isinstance(spec, dict):
            raise ValueError("expected a JSON object")
        per_node, reps, run_dir = int(spec["per_node"]), int(spec["reps"]), Path(spec["run_dir"])
        env = read_rank_env(per_node, per_node, force_cpu=bool(spec.get("cpu_only")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"reshardctl calibrate worker: cannot read the spec {a.spec}: {exc}", file=sys.stderr)
        return 2
    except ReshardError as exc:
        print(f"reshardctl calibrate worker: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    out = run_dir / "results" / f"rank-{env.global_rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        device = torch.device(env.device)
        if env.backend == "nccl":
            torch.cuda.set_device(device)
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.global_rank == 0,
                              timeout=timedelta(seconds=float(spec.get("rendezvous_timeout_s", 120))))
        dist.init_process_group(env.backend, store=store, rank=env.global_rank, world_size=env.world_size,
                                timeout=timedelta(seconds=float(spec.get("timeout_s", 300))))
        from reshardctl.calibrate.microbench import run

        res = run(env.global_rank, per_node, device, reps)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        res.update(host=os.environ.get("SLURMD_NODENAME") or socket.gethostname(), versions=_versions(env.backend),
                   cores=cores)
        write_json_atomic(out, {"ok": True, "result": res}, indent=1)
        dist.destroy_process_group()
        return 0
    except Exception as exc:  # noqa: BLE001 - recorded for the launcher, then a non-zero exit
        write_json_atomic(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, indent=1)
        print(f"reshardctl calibrate worker rank {env.global_rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
