"""Resolve and validate every input of a plan or a run: site, model, layouts, topology, bucket, relay.

One function (``prepare``) loads everything and raises ONE ``InputError``/``LayoutError`` listing every
problem, before any planning or process start. Pure apart from reading the input files.

``--relay auto`` turns the two-stage fan-out on when the site has GPUs (not ``cpu_only``) and the
NVLink bandwidth of a GPU is at least twice its NIC bandwidth, where a GPU's NIC bandwidth is
``min(nic_bytes_per_s, nics_per_node * nic_bytes_per_s / gpus_per_node)`` (its rail, or its share of
the node's NICs when every GPU sends at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reshardctl.atomic_write import output_problem
from reshardctl.errors import InputError, LayoutError
from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.request.request import RefitRequest
from reshardctl.site.spec import bucket_mb_problem

TRANSPORT_CHOICES = TRANSPORTS + ("all",)
RELAY_MODES = ("auto", "on", "off")
MIB = 1 << 20


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
    request: RefitRequest | None = None  # what was resolved (session.json and summary.json hold it whole)

    @property
    def broadcast_span(self) -> str:
        """GPU sites: broadcast groups span the stage's trainer GPUs (rings over every NIC of the source
        nodes); cpu_only sites: root + inference ranks (every extra member is one more host copy)."""
        return "root" if self.site.cpu_only else "stage"


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


def _label(label: str, violation: str) -> str:
    """``--train: <violation>``, without doubling a prefix the violation already carries."""
    return violation if violation.startswith(f"{label}:") or violation.startswith(f"{label} ") else f"{label}: {violation}"


def layout_or_problems(model, side, spec, style, layout_file, problems: list[str], label: str):
    """``(layout, world_size)``. When the layout cannot be built its problems go to ``problems`` and the
    layout is None, but the world size is still returned when it is known (from the parallel string or
    the layout file), so the allocation is checked too and every violation is reported at once."""
    from reshardctl.layout.build import build_layout

    try:
        lay = build_layout(model, side, spec, style, str(layout_file) if layout_file else None)
        return lay, lay.world_size
    except LayoutError as e:
        problems.extend(_label(label, v) for v in e.violations)
        return None, getattr(e, "world_size", None)
    except InputError as e:
        problems.append(_label(label, str(e)))
    return None, None


def topology_or_problems(site, train_world: int | None, infer_world: int | None, problems: list[str], label: str):
    """The allocation rule shared by ``plan``, ``run`` and ``layout show --site``: the nodes each side
    needs (``ceil(world / gpus_per_node)``) must fit in the site's nodes. None when a world is unknown."""
    from reshardctl.topology import Topology

    if train_world is None or infer_world is None:
        return None
    try:
        return Topology.from_site(site, train_world, infer_world)
    except LayoutError as e:
        problems.extend(_label(label, v) for v in e.violations)
    return None


def prepare(request: RefitRequest, *, out: str | None = None, export: str | None = None,
            compare: list[str] | None = None) -> Inputs:
    """Load and validate every input of ``request``; raise one ``InputError`` listing every problem.
    ``out``/``export``/``compare``: `plan`'s outputs and candidate inference layouts."""
    from reshardctl.models import load_model
    from reshardctl.site import load_profile

    r = request
    site, model, layers, train, infer = r.site, r.model, r.layers, r.train, r.infer
    train_style, infer_style, train_layout, infer_layout = r.train_style, r.infer_style, r.train_layout, r.infer_layout
    transport, bucket_mb, relay, mtp = r.transport, r.bucket_mb, r.relay, r.mtp
    problems: list[str] = []
    if transport not in TRANSPORT_CHOICES:
        problems.append(f"--transport {transport!r}: expected one of {', '.join(TRANSPORT_CHOICES)}")
    if relay not in RELAY_MODES:
        problems.append(f"--relay {relay!r}: expected one of {', '.join(RELAY_MODES)}")
    if bucket_mb is not None and (why := bucket_mb_problem(bucket_mb)):
        problems.append(f"--bucket-mb {bucket_mb:g}: {why}")
    problems.extend(output_problems(out, export))
    for lf, flag in ((train_layout, "--train-layout"), (infer_layout, "--infer-layout")):
        if lf is not None:
            problems.extend(layout_file_problems(lf, flag))
    if mtp and layers is not None:
        problems.append(f"--mtp with --layers {layers}: the MTP layers follow the last decoder layer; "
                        f"give one or the other")
    if problems:  # flag problems first: nothing below can help them
        _raise(problems)
    prof = load_profile(site)
    m = load_model(model, layers=layers, include_mtp=mtp)
    tl, tw = layout_or_problems(m, "train", train, train_style, train_layout, problems, "--train")
    il, iw = layout_or_problems(m, "infer", infer, infer_style, infer_layout, problems, "--infer")
    topo = topology_or_problems(prof, tw, iw, problems, "allocation")
    cands: list[Candidate] = []
    compare = list(compare or [])
    for spec in compare:
        cl, cw = layout_or_problems(m, "infer", spec, infer_style, None, problems, f"--compare-infer {spec!r}")
        ct = topology_or_problems(prof, tw, cw, problems, f"--compare-infer {spec!r}")
        if cl is not None and tl is not None and ct is not None:
            cands.append(Candidate(spec, cl, ct))
    if problems:
        _raise(problems, layout=True)
    mb = bucket_mb if bucket_mb is not None else prof.refit.bucket_mb  # both checked by bucket_mb_problem
    on, why = resolve_relay(relay, prof)
    transports = TRANSPORTS if transport == "all" else (transport,)
    primary = prof.refit.transport if transport == "all" else transport
    if compare:
        from reshardctl.layout.build import DEFAULT_SPEC

        cur = infer_layout or infer or DEFAULT_SPEC["infer"]
        cands.insert(0, Candidate(str(cur), il, topo, current=True))
    return Inputs(prof, m, tl, il, topo, site_links(prof), int(mb * MIB), on, relay, why, transports, primary,
                  train_style, infer_style, layers, cands, request)


def site_links(prof):
    """The cost model's figures for a site: its calibration file when there is one (``site/measured.py``),
    else the profile's datasheet figures; on cpu_only sites the cores of this machine and the checksum
    rate of one rank here (one thread, the path this machine's ranks take: runtime/checksum_choice.py,
    measured once per machine and cached)."""
    import os

    from reshardctl.plan.cost import Links
    from reshardctl.site.measured import find_measured

    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) if prof.cpu_only else None
    probe = None
    if prof.cpu_only:  # CPU ranks (GPU sites' checksums take the float64 path on CUDA; no torch import here)
        from reshardctl.errors import InputError
        from reshardctl.runtime import checksum_choice

        why = checksum_choice.env_problem()  # the ranks would refuse it: say so before anything starts
        if why:
            raise InputError(why)
        try:
            c = checksum_choice.choice(threads=1)
        except ValueError as exc:  # a forced path that fails its exactness probe here
            raise InputError(str(exc)) from exc
        if c.rate:
            probe = (c.rate, f"{c.path} {c.rate / 1e9:.2f} GB/s, measured on this machine ({c.cpu})")
    return Links.from_site(prof, find_measured(prof), cores=cores, checksum_probe=probe)
def layout_file_problems(path: str, flag: str) -> list[str]:
    """A layout file flag that cannot name a readable file: empty, missing, a directory."""
    if not path:
        return [f"{flag} '': empty; give a layout file (.yaml/.yml/.json)"]
    p = Path(path)
    if p.is_dir():
        return [f"{flag} {path}: is a directory; give a layout file (.yaml/.yml/.json) in it"]
    if not p.exists():
        return [f"{flag} {path}: no such file"]
    return []


def output_problems(out: str | None, export: str | None) -> list[str]:
    """``--out DIR`` / ``--export-transfers FILE`` that cannot be written (docs/plan-format.md, "Outputs"):
    an empty name; DIR an existing file; FILE a directory; both naming the same path. Missing parent
    directories are created for both (when everything else succeeded). ``--export-transfers -`` is stdout."""
    problems = []
    if out is not None and not out.strip():
        problems.append("--out '': empty; give a directory (it is created, with its parents)")
        out = None
    if export is not None and not export.strip():
        problems.append("--export-transfers '': empty; give a file name, or - for stdout")
        export = None
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        problems.append(f"--out {out}: exists and is not a directory")
    elif out is not None and Path(out).is_dir():
        from reshardctl.errors import InputError
        from reshardctl.runs.rundir import check_dir_owner

        try:  # it will hold session.pkl (the run token, unpickled by the ranks): the user's alone
            check_dir_owner(out)
        except InputError as exc:
            problems.append(exc.message)
    if export is not None and export != "-":
        ep = Path(export)
        why = output_problem(ep)  # a directory, a FIFO, a device (or a link to one): never replaced
        if why:
            problems.append(f"--export-transfers {export}: {why}")
        if out is not None and ep.absolute() == Path(out).absolute():
            problems.append(f"--out and --export-transfers both name {export}: give two different paths")
        for parent in [ep.absolute(), *ep.absolute().parents]:
            if parent.exists() and not parent.is_dir():
                if parent != ep.absolute():
                    problems.append(f"--export-transfers {export}: {parent} is a file, not a directory")
                break
    if out is not None:
        for parent in Path(out).absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    problems.append(f"--out {out}: {parent} is a file, not a directory")
                break
    return problems


def _raise(problems: list[str], layout: bool = False) -> None:
    if layout:
        raise LayoutError(problems)
    msg = problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
    raise InputError(msg)
