"""Start a calibration world, collect rank 0's measurements, fit the figures, build the calibration file.

Ranks start through the site's launcher:

* ``measure``: local processes (gloo on CPU, NCCL where every rank has a GPU). A site of GPU nodes
  cannot be calibrated from processes on this machine (its figures would be this machine's): refused.
* ``measure_slurm``: a Slurm het job of two whole nodes of the site (component 0 and 1 are the two nodes
  of ``microbench.py``), each rank ``python -m reshardctl.calibrate.worker``; the site's own nodes,
  GPUs and fabric are measured, so GPU sites are calibrated this way.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import queue as _queue
import socket
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reshardctl.bounded_load import LoadError, loads_json, read_bytes
from reshardctl.errors import InputError, LaunchError
from reshardctl.site.measured import FIGURES, FORMAT, OPTIONAL_FIGURES

MAX_RESULT_BYTES = 16 << 20  # results/rank-N.json of a Slurm calibration rank (a few KiB in practice)
MAX_PER_NODE = 4  # ranks per stand-in node when every rank is a process on this machine


def _child(rank: int, world: int, per_node: int, port: int, backend: str, reps: int, q) -> None:
    torch.set_num_threads(1)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
        from reshardctl.calibrate.microbench import run

        res = run(rank, per_node, device, reps)
        res["host"] = socket.gethostname()
        q.put((rank, res, None))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put((rank, None, f"{type(exc).__name__}: {exc}"))


def measure(site, reps: int = 5, deadline_s: float = 600.0) -> dict:
    """Run the microbenchmarks on ``2 x per_node`` ranks; rank 0's raw results plus every rank's host."""
    from reshardctl.launch.local import choose_local_backend
    from reshardctl.launch.ports import free_port

    if not site.cpu_only:
        raise InputError(
            f"site {site.name} describes GPU nodes ({', '.join(site.nodes[:2])}...): calibrating it means running on "
            f"them through its launcher, and only the local launcher exists; calibrating here would measure this "
            f"machine, not the site (its predictions keep the datasheet figures of its profile)")
    per_node = min(site.gpus_per_node, MAX_PER_NODE)
    world = 2 * per_node
    backend = choose_local_backend(world, "auto")
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, world, per_node, port, backend, reps, q), name=f"reshardctl-calib-{r}")
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, dict] = {}
    errors: list[str] = []
    end = time.monotonic() + deadline_s
    try:
        while len(got) + len(errors) < world and time.monotonic() < end:
            try:
                rank, res, err = q.get(timeout=0.5)
            except _queue.Empty:
                if all(p.exitcode is not None for p in procs) and q.empty():
                    break
                continue
            if err:
                errors.append(f"rank {rank}: {err}")
            else:
                got[rank] = res
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        q.close()
    if errors or 0 not in got:
        raise LaunchError("calibration failed: " + ("; ".join(errors) or f"{world - len(got)} rank(s) gave no result"))
    out = dict(got[0])
    out["hosts"] = sorted({r["host"] for r in got.values()})
    out["world"], out["per_node"], out["backend"] = world, per_node, backend
    return out


def measure_slurm(site, run_dir, *, python: str, reps: int = 5,
                  on_state=None) -> tuple[dict, object]:
    """Run the microbenchmarks as a Slurm het job on two of the site's nodes (every GPU, or
    ``gpus_per_node`` CPU ranks, of each); rank 0's raw results plus every rank's host; and the
    ``SlurmRun``. ``run_dir`` (absolute, seen by every node) receives the script, logs and results."""
    from pathlib import Path

    from reshardctl.atomic_write import write_json_atomic
    from reshardctl.launch import slurm
    from reshardctl.launch.slurm_request import build_request
    from reshardctl.topology import Topology

    run_dir = Path(run_dir)
    per_node = site.gpus_per_node
    spec = {"per_node": per_node, "reps": reps, "run_dir": str(run_dir), "cpu_only": site.cpu_only,
            "timeout_s": site.refit.timeout_s, "rendezvous_timeout_s": site.refit.rendezvous_timeout_s}
    spec_path = write_json_atomic(run_dir / "calibrate.json", spec, indent=2)
    request = build_request(site, Topology.from_site(site, per_node, per_node), str(run_dir), mode="hetjob",
                            label="calibrate", python=python, what="calibration microbenchmarks",
                            rank_args=["-m", "reshardctl.calibrate.worker", "--spec", str(spec_path)])
    run = slurm.submit(request)
    w = slurm.watch(run, on_state)
    world = 2 * per_node
    got, errors = {}, []
    for r in range(world):
        try:
            rec = loads_json(read_bytes(run_dir / "results" / f"rank-{r}.json", MAX_RESULT_BYTES))
        except LoadError:
            errors.append(f"rank {r}: no result" + slurm._last_words(run_dir, r))
            continue
        if rec.get("ok"):
            got[r] = rec["result"]
        else:
            errors.append(f"rank {r}: {rec.get('error')}")
    bad = {j: s.state for j, s in w.states.items() if s.state != "COMPLETED"}
    if errors or bad or 0 not in got:
        jobs = "; ".join(f"Slurm job {j}: {st}" for j, st in bad.items())
        raise LaunchError("calibration on Slurm failed: " + "; ".join(x for x in (jobs, *errors[:8]) if x),
                          hint=f"the job's output and the ranks' logs are in {run_dir}")
    out = dict(got[0])
    out["hosts"] = sorted({r["host"] for r in got.values()})
    out["world"], out["per_node"], out["backend"] = world, per_node, out["versions"]["backend"]
    out["slurm"] = {"job_ids": run.job_ids, "states": {j: s.state for j, s in w.states.items()}}
    return out, run


def fit_alpha_beta(points) -> tuple[float, float]:
    """``seconds = latency + bytes / bandwidth`` by least squares over (bytes, seconds) points; a
    non-physical fit (negative latency or slope from noise) falls back to the smallest message's time
    and the largest message's rate."""
    x = np.asarray([p[0] for p in points], dtype=np.float64)
    y = np.asarray([p[1] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    bw = 1.0 / slope if slope > 0 else x[-1] / y[-1]
    lat = intercept if intercept > 0 else float(y[np.argmin(x)])
    return float(lat), float(bw)


def figures(raw: dict) -> dict:
    intra_lat, intra_bw = fit_alpha_beta(raw["p2p"]["intra_node"])
    cross_lat, cross_bw = fit_alpha_beta(raw["p2p"]["cross_node"])
    g = raw["grouped"]
    (n1, nm), (t1, tm) = g["counts"], g["seconds"]
    per_msg = max((tm - t1) / (nm - n1), 1e-9)
    launch = max(t1 - per_msg, 1e-9)
    agg, bc = raw["aggregate"], raw["broadcast"]
    out = {
        "intra_node_bytes_per_s": intra_bw, "intra_node_latency_s": intra_lat,
        "cross_node_bytes_per_s": cross_bw, "cross_node_latency_s": cross_lat,
        "node_aggregate_bytes_per_s": agg["bytes"] / agg["seconds"], "launch_s": launch, "per_message_s": per_msg,
        "broadcast_bytes_per_s": bc["bytes"] * bc["receivers"] / bc["seconds"],
        "copy_bytes_per_s": raw["copy"]["bytes"] / raw["copy"]["seconds"],
        "checksum_bytes_per_s": raw["checksum"]["bytes"] / raw["checksum"]["seconds"],
        "copy_side_bytes_per_s": raw["copy_side"]["bytes"] / raw["copy_side"]["seconds"],
        "checksum_side_bytes_per_s": raw["checksum_side"]["bytes"] / raw["checksum_side"]["seconds"],
    }
    if "checksum_world" in raw:
        out["checksum_world_bytes_per_s"] = raw["checksum_world"]["bytes"] / raw["checksum_world"]["seconds"]
    if "control" in raw:
        out["control_round_s"] = raw["control"]["seconds"]
    if "landing" in raw:
        ld = raw["landing"]
        out["landing_s_per_param"] = max(ld["direct_seconds"] / ld["views"], 1e-12)
        out["loader_s_per_tensor"] = max(ld["loader_seconds"] / ld["views"], 1e-12)
        if "mapping_seconds" in ld:  # the framework load_weights' host costs (plan/engine_cost.py)
            out["mapping_s_per_entry"] = max(ld["mapping_seconds"] / ld["views"], 1e-12)
            out["named_params_s_per_param"] = max(ld["named_params_seconds"] / ld["views"], 1e-12)
    assert set(FIGURES) <= set(out) <= set(FIGURES) | set(OPTIONAL_FIGURES)
    return out


def calibration(site, raw: dict, now: _dt.datetime | None = None) -> dict:
    """The calibration file's content (``site/measured.py`` ``FORMAT``)."""
    from reshardctl import __version__

    now = now or _dt.datetime.now(_dt.timezone.utc)
    versions = raw.get("versions")  # a launcher's ranks report their own (the site's nodes)
    if versions is None:
        versions = {"reshardctl": __version__, "torch": torch.__version__, "python": platform.python_version(),
                    "backend": raw["backend"]}
        if raw["backend"] == "nccl":
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if raw["checksum"].get("path"):  # the checksum path the figures were measured on (a later run may take another)
        versions = {**versions, "checksum_path": raw["checksum"]["path"]}
    cores = raw.get("cores") or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    extra = {"slurm": raw["slurm"]} if "slurm" in raw else {}
    return {
        "format": FORMAT, "site": site.name, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "hosts": raw["hosts"],
        "versions": versions, "ranks": raw["world"], "cores": cores, "figures": figures(raw),
        "samples": {k: raw[k] for k in ("p2p", "aggregate", "grouped", "broadcast", "copy", "checksum", "copy_side",
                                          "checksum_side", "checksum_world", "control", "landing") if k in raw},
        "launcher": "slurm" if extra else "local", **extra,
    }
