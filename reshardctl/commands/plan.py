"""`reshardctl plan`: plan a refit for a site, a model and two layouts; compare the transports.

Everything is validated before any planning (every layout problem listed at once, exit code 2), and
nothing is written unless the whole run succeeds: ``--out`` fills a temporary directory (or temporary
names) and renames; ``--export-transfers`` writes a temporary file and renames it.

``--relay auto`` turns the two-stage fan-out on when the site has GPUs (not ``cpu_only``) and the
NVLink bandwidth of a GPU is at least twice its NIC bandwidth, where a GPU's NIC bandwidth is
``min(nic_bytes_per_s, nics_per_node * nic_bytes_per_s / gpus_per_node)`` (its rail, or its share of
the node's NICs when every GPU sends at once). Reference: docs/plan-format.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from reshardctl.commands import output
from reshardctl.errors import InputError, LayoutError
from reshardctl.plan.model import TRANSPORTS, Plan

TRANSPORT_CHOICES = TRANSPORTS + ("all",)
RELAY_MODES = ("auto", "on", "off")
MIB = 1 << 20
LINK_CLASSES = ("intra_node", "intra_domain", "cross_domain")


# ---------------------------------------------------------------- inputs ---------------------------------
@dataclass
class Candidate:
    spec: str
    layout: object
    topology: object
    current: bool = False


@dataclass
class Inputs:
    site: object
    model: object
    train: object
    infer: object
    topology: object
    links: object
    bucket_bytes: int
    relay: bool
    relay_mode: str
    relay_reason: str
    transports: tuple[str, ...]
    primary: str
    train_style: str
    infer_style: str
    layers: int | None
    compare: list[Candidate] = field(default_factory=list)


def nic_per_gpu(site) -> float:
    lk = site.links
    return min(lk.nic_bytes_per_s, lk.node_nic_bytes_per_s / site.gpus_per_node)


def resolve_relay(mode: str, site) -> tuple[bool, str]:
    """``(relay, why)`` for ``--relay auto|on|off``."""
    if mode == "on":
        return True, "--relay on"
    if mode == "off":
        return False, "--relay off"
    if site.cpu_only:
        return False, f"auto: site {site.name} is cpu_only"
    nv, nic = site.links.nvlink_bytes_per_s, nic_per_gpu(site)
    on = nv >= 2 * nic
    return on, f"auto: NVLink {nv / 1e9:g} GB/s per GPU {'>=' if on else '<'} 2 x NIC {nic / 1e9:g} GB/s per GPU"


def _layout(model, side, spec, style, layout_file, problems: list[str], label: str):
    from reshardctl.layout.build import build_layout

    try:
        return build_layout(model, side, spec, style, str(layout_file) if layout_file else None)
    except LayoutError as e:
        problems.extend(f"{label}: {v}" for v in e.violations)
    except InputError as e:
        problems.append(f"{label}: {e}")
    return None


def _topology(site, train, infer, problems: list[str], label: str):
    from reshardctl.topology import Topology

    try:
        return Topology.from_site(site, train.world_size, infer.world_size)
    except LayoutError as e:
        problems.extend(f"{label}: {v}" for v in e.violations)
    return None


def prepare(
    *, site: str, model: str, layers: int | None, train: str | None, infer: str | None, train_style: str,
    infer_style: str, train_layout: str | None, infer_layout: str | None, transport: str,
    bucket_mb: float | None, relay: str, out: str | None, export: str | None, compare: list[str],
) -> Inputs:
    """Load and validate every input; raise one ``InputError`` listing every problem."""
    from reshardctl.models import load_model
    from reshardctl.plan.cost import Links
    from reshardctl.site import load_profile

    problems: list[str] = []
    if transport not in TRANSPORT_CHOICES:
        problems.append(f"--transport {transport!r}: expected one of {', '.join(TRANSPORT_CHOICES)}")
    if relay not in RELAY_MODES:
        problems.append(f"--relay {relay!r}: expected one of {', '.join(RELAY_MODES)}")
    if bucket_mb is not None and not bucket_mb > 0:
        problems.append(f"--bucket-mb must be > 0 (got {bucket_mb:g})")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        problems.append(f"--out {out}: exists and is not a directory")
    if export is not None:
        ep = Path(export)
        if ep.is_dir():
            problems.append(f"--export-transfers {export}: is a directory")
        elif not ep.parent.is_dir():
            problems.append(f"--export-transfers {export}: directory {ep.parent} does not exist")
    for lf, flag in ((train_layout, "--train-layout"), (infer_layout, "--infer-layout")):
        if lf is not None and not Path(lf).is_file():
            problems.append(f"{flag} {lf}: no such file")
    if problems:  # flag problems first: nothing below can help them
        _raise(problems)
    prof = load_profile(site)
    m = load_model(model, layers=layers)
    tl = _layout(m, "train", train, train_style, train_layout, problems, "--train")
    il = _layout(m, "infer", infer, infer_style, infer_layout, problems, "--infer")
    topo = _topology(prof, tl, il, problems, "allocation") if tl is not None and il is not None else None
    cands: list[Candidate] = []
    for spec in compare:
        cl = _layout(m, "infer", spec, infer_style, None, problems, f"--compare-infer {spec!r}")
        if cl is not None and tl is not None:
            ct = _topology(prof, tl, cl, problems, f"--compare-infer {spec!r}")
            if ct is not None:
                cands.append(Candidate(spec, cl, ct))
    if problems:
        _raise(problems, layout=True)
    mb = bucket_mb if bucket_mb is not None else prof.refit.bucket_mb
    on, why = resolve_relay(relay, prof)
    transports = TRANSPORTS if transport == "all" else (transport,)
    primary = prof.refit.transport if transport == "all" else transport
    if compare:
        from reshardctl.layout.build import DEFAULT_SPEC

        cur = infer_layout or infer or DEFAULT_SPEC["infer"]
        cands.insert(0, Candidate(str(cur), il, topo, current=True))
    return Inputs(prof, m, tl, il, topo, Links.from_site(prof), int(mb * MIB), on, relay, why, transports, primary,
                  train_style, infer_style, layers, cands)


def _raise(problems: list[str], layout: bool = False) -> None:
    if layout:
        raise LayoutError(problems)
    msg = problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
    raise InputError(msg)


# ---------------------------------------------------------------- reports --------------------------------
def _class_of(topo, a: int, b: int) -> int:
    if topo.node_of[a] == topo.node_of[b]:
        return 0
    return 1 if topo.domain_of[a] == topo.domain_of[b] else 2


def bucket_link_bytes(plan: Plan) -> np.ndarray:
    """Bytes per link class of the broadcast buckets: gathers to the root, then the broadcast ring."""
    out = np.zeros(3, dtype=np.int64)
    topo = plan.topology
    for b in plan.buckets:
        for pr in b.gather:
            if pr.peer != b.root:
                out[_class_of(topo, pr.peer, b.root)] += pr.nbytes
        for a, c in zip(b.group, b.group[1:]):
            out[_class_of(topo, a, c)] += b.nbytes
    return out


def side_of(plan: Plan, rank: int) -> tuple[str, int]:
    T = plan.train_world
    return ("train", rank) if rank < T else ("infer", rank - T)


def transport_report(plan: Plan, links, lb) -> dict:
    """One transport's row (the ``transports.<name>`` object of ``--json``)."""
    from reshardctl.plan.cost import predict
    from reshardctl.plan.stats import p2p_stats

    stats = p2p_stats(plan) if plan.rounds else None
    pred = predict(plan, links, stats)
    by_link = np.zeros(3, dtype=np.int64)
    if stats is not None:
        by_link += np.asarray([stats.bytes_by_link[k] for k in LINK_CLASSES], dtype=np.int64)
    by_link += bucket_link_bytes(plan)
    transfers = plan.num_transfers + sum(
        sum(len(pr.regions) for pr in b.gather if pr.peer != b.root) + len(b.group) - 1 for b in plan.buckets)
    staging = max([stats.max_staging if stats else 0] + [b.nbytes for b in plan.buckets])
    side, side_rank = side_of(plan, pred.busiest_rank)
    return {
        "predicted_s": pred.predicted_s,
        "efficiency": (lb.seconds / pred.predicted_s) if pred.predicted_s > 0 else 1.0,
        "bytes_moved": int(pred.bytes_moved),
        "transfers": int(transfers),
        "p2p_transfers": int(plan.num_transfers),
        "rounds": len(plan.rounds),
        "buckets": len(plan.buckets),
        "max_staging_bytes": int(staging),
        "busiest": {"rank": int(pred.busiest_rank), "side": side, "side_rank": int(side_rank),
                    "link": pred.busiest_link, "bytes": int(pred.busiest_link_bytes)},
        "fingerprint": plan.fingerprint,
        "relay": bool(plan.relay),
        "bucket_bytes": int(plan.bucket_bytes),
        "bytes_by_link": {k: int(v) for k, v in zip(LINK_CLASSES, by_link)},
        "planning_s": plan.planning_s,
    }


def infer_needed_bytes(model, infer) -> int:
    """Bytes all inference ranks together must end up holding (replicas counted per rank)."""
    total = 0
    cache: dict = {}
    for i, t in enumerate(model.tensors):
        p = infer.placement(i)
        n = cache.get(id(p.template))
        if n is None:
            n = cache[id(p.template)] = sum(p.template.slot_numel(s) for s in range(p.template.num_slots))
        total += n * t.itemsize
    return int(total)


def run(inp: Inputs) -> tuple[dict[str, Plan], dict]:
    """Plan every requested transport (+ candidates); return the plans and the ``--json`` object."""
    from reshardctl.plan.cost import lower_bound
    from reshardctl.plan.m2n_compat import m2n_compat
    from reshardctl.plan.planner import build_plan

    t0 = time.perf_counter()
    order = (inp.primary,) + tuple(t for t in inp.transports if t != inp.primary) if inp.primary in inp.transports else inp.transports
    plans: dict[str, Plan] = {}
    for tname in order:
        plans[tname] = build_plan(inp.model, inp.train, inp.infer, inp.topology, transport=tname,
                                  bucket_bytes=inp.bucket_bytes, relay=inp.relay)
    first = plans[order[0]]
    lb = lower_bound(first, inp.links)
    reports = {t: transport_report(p, inp.links, lb) for t, p in plans.items()}
    reshard_units = plans["reshard"].units if "reshard" in plans and not inp.relay else None
    compat = m2n_compat(inp.model, inp.train, inp.infer, inp.topology, units=reshard_units)
    result = {
        "fingerprint": first.fingerprint,
        "primary_transport": order[0],
        "bytes_total": int(inp.model.num_bytes),
        "bytes_needed_by_inference_ranks": infer_needed_bytes(inp.model, inp.infer),
        "lower_bound_s": lb.seconds,
        "lower_bound_reason": lb.reason,
        "transports": reports,
        "m2n_compat": compat,
        "planning_s": 0.0,
        "inputs": inputs_json(inp),
    }
    if inp.compare:
        result["compare"] = compare(inp, order[0])
    result["planning_s"] = time.perf_counter() - t0
    return plans, result


def compare(inp: Inputs, transport: str) -> list[dict]:
    from reshardctl.plan.cost import lower_bound, predict
    from reshardctl.plan.planner import build_plan

    rows = []
    for c in inp.compare:
        p = build_plan(inp.model, inp.train, c.layout, c.topology, transport=transport,
                       bucket_bytes=inp.bucket_bytes, relay=inp.relay)
        pred = predict(p, inp.links)
        lb = lower_bound(p, inp.links)
        rows.append({
            "infer": c.spec, "layout": c.layout.describe(), "current": c.current,
            "infer_world": c.layout.world_size, "transport": transport, "predicted_s": pred.predicted_s,
            "lower_bound_s": lb.seconds,
            "efficiency": lb.seconds / pred.predicted_s if pred.predicted_s > 0 else 1.0,
            "bytes_moved": int(pred.bytes_moved), "fingerprint": p.fingerprint,
        })
    rows.sort(key=lambda r: (r["predicted_s"], r["infer"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    return rows


def inputs_json(inp: Inputs) -> dict:
    s, m = inp.site, inp.model
    return {
        "site": s.name,
        "site_source": s.source,
        "model": m.name,
        "model_source": m.source,
        "layers": inp.layers,
        "num_tensors": len(m.tensors),
        "train": inp.train.describe(),
        "infer": inp.infer.describe(),
        "train_style": inp.train_style,
        "infer_style": inp.infer_style,
        "topology": inp.topology.describe(),
        "transports": list(inp.transports),
        "bucket_bytes": inp.bucket_bytes,
        "relay": inp.relay,
        "relay_mode": inp.relay_mode,
        "relay_reason": inp.relay_reason,
    }


# ---------------------------------------------------------------- writing --------------------------------
def _tmp_file(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


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
    from reshardctl.plan.serialize import file_mode

    path = Path(path)
    fd, tmp = _tmp_file(path)
    n = 0
    try:
        with os.fdopen(fd, "w") as f:
            for line in transfer_lines(plan):
                f.write(json.dumps(line, separators=(",", ":")))
                f.write("\n")
                n += 1
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def dir_mode() -> int:
    """0o777 minus the process umask (``mkdtemp`` creates 0o700 directories)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


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
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            files = _write_files(tmp, plans, result)
            os.chmod(tmp, dir_mode())
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
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


# ---------------------------------------------------------------- human output ---------------------------
def _b(n: float) -> str:
    from reshardctl.commands.model import human_bytes

    return human_bytes(int(n))


def _s(x: float) -> str:
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} us"


def _console():
    """stdout console; when stdout is not a terminal (a pipe, a log) wide enough for the tables."""
    con = output.console()
    if not con.is_terminal:
        from rich.console import Console

        con = Console(highlight=False, soft_wrap=True, width=160)
    return con


def render(result: dict) -> None:
    con = _console()
    inp = result["inputs"]
    topo = inp["topology"]
    con.print(f"[bold]{escape(inp['model'])}[/bold] ({inp['num_tensors']} tensors, {_b(result['bytes_total'])}) "
              f"on site [bold]{escape(inp['site'])}[/bold]", markup=True)
    con.print(f"train {inp['train']}  ({topo['train_world']} ranks, {topo['train_nodes']} node(s))", markup=False)
    con.print(f"infer {inp['infer']}  ({topo['infer_world']} ranks, {topo['infer_nodes']} node(s))", markup=False)
    con.print(f"bucket {_b(inp['bucket_bytes'])}, relay {'on' if inp['relay'] else 'off'} ({inp['relay_reason']})",
              markup=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    cols = ("transport", "on wire", "transfers", "rounds/bkts", "staging max", "predicted", "eff.", "busiest rank, link")
    for col in cols:
        table.add_column(col, justify="left" if col in ("transport", cols[-1]) else "right", no_wrap=True)
    for name, r in result["transports"].items():
        bz = r["busiest"]
        mark = "*" if name == result["primary_transport"] else ""
        table.add_row(
            escape(name + mark), _b(r["bytes_moved"]), f"{r['transfers']:,}", f"{r['rounds']}/{r['buckets']}",
            _b(r["max_staging_bytes"]), _s(r["predicted_s"]), f"{100 * r['efficiency']:.0f}%",
            escape(f"{bz['side']}{bz['side_rank']} {bz['link']} {_b(bz['bytes'])}"),
        )
    con.print(table)
    con.print(f"lower bound {_s(result['lower_bound_s'])}: {result['lower_bound_reason']}", markup=False)
    if len(result["transports"]) > 1:
        con.print(f"* = primary transport (fingerprint {result['fingerprint']})", markup=False)
    else:
        con.print(f"fingerprint {result['fingerprint']}", markup=False)
    from reshardctl.plan.m2n_compat import summary_line

    con.print(summary_line(result["m2n_compat"]), markup=False)
    if "compare" in result:
        ct = Table(show_header=True, header_style="bold", box=None, pad_edge=False,
                   title=f"inference layouts by predicted refit time ({result['compare'][0]['transport']})")
        for col in ("#", "infer", "layout", "ranks", "predicted", "lower bound", "efficiency", "bytes on wire"):
            ct.add_column(col, justify="left" if col in ("infer", "layout") else "right")
        for r in result["compare"]:
            ct.add_row(str(r["rank"]), escape(r["infer"] + (" (current)" if r["current"] else "")), escape(r["layout"]),
                       str(r["infer_world"]), _s(r["predicted_s"]), _s(r["lower_bound_s"]),
                       f"{100 * r['efficiency']:.0f}%", _b(r["bytes_moved"]))
        con.print(ct)


# ---------------------------------------------------------------- command --------------------------------
def plan_cmd(
    site: str = typer.Option("local", "--site", help="Site profile name or file."),
    model: str = typer.Option("tiny-llama", "--model", "-m", help="Preset name or path (config.json / index / directory)."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Keep only the first N decoder layers."),
    train: Optional[str] = typer.Option(None, "--train", help='Trainer parallelism, e.g. "tp=4,pp=2" (default tp=2,dp=2).'),
    infer: Optional[str] = typer.Option(None, "--infer", help='Inference parallelism, e.g. "tp=8,dp=2" (default tp=2,dp=2).'),
    train_style: str = typer.Option("megatron", "--train-style", help="megatron | dtensor"),
    infer_style: str = typer.Option("vllm", "--infer-style", help="vllm | dtensor"),
    train_layout: Optional[str] = typer.Option(None, "--train-layout", help="Trainer layout file (overrides --train)."),
    infer_layout: Optional[str] = typer.Option(None, "--infer-layout", help="Inference layout file (overrides --infer)."),
    transport: str = typer.Option("all", "--transport", help="reshard | gather_broadcast | hybrid | all"),
    bucket_mb: Optional[float] = typer.Option(None, "--bucket-mb", help="Bucket / round bound in MiB (default: the profile's refit.bucket_mb)."),
    relay: str = typer.Option("auto", "--relay", help="Two-stage NVLink fan-out: auto | on | off."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON report on stdout."),
    out: Optional[str] = typer.Option(None, "--out", help="Write plan-<transport>.npz and plan.json into DIR."),
    export: Optional[str] = typer.Option(None, "--export-transfers", help="Write every transfer as JSON lines to FILE."),
    compare_infer: Optional[List[str]] = typer.Option(None, "--compare-infer", help="Candidate inference layout to rank (repeatable)."),
) -> None:
    """Plan a refit: bytes, rounds, staging and predicted seconds per transport, against the lower bound."""
    inp = prepare(site=site, model=model, layers=layers, train=train, infer=infer, train_style=train_style,
                  infer_style=infer_style, train_layout=train_layout, infer_layout=infer_layout, transport=transport,
                  bucket_mb=bucket_mb, relay=relay, out=out, export=export, compare=list(compare_infer or []))
    plans, result = run(inp)
    if out is not None:
        for p in write_out(out, plans, result):
            output.info(f"wrote {escape(str(p))}")
    if export is not None:
        n = export_transfers(plans[result["primary_transport"]], export)
        output.info(f"wrote {n:,} {escape(result['primary_transport'])} transfer lines to {escape(str(export))}")
    if as_json:
        output.print_json(result)
    else:
        render(result)


__all__ = ["plan_cmd", "prepare", "run", "transfer_lines", "export_transfers", "write_out", "resolve_relay"]
