"""``parse_profile``: a mapping (from YAML or TOML) -> a validated ``SiteProfile``.

Every problem of one file is collected and reported together in one ``ProfileError``: unknown keys (with
a did-you-mean), wrong types (key path, expected form, the value given), impossible numbers (with the
arithmetic). ``null`` (or leaving a key out) means "the default".
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from reshardctl.errors import ProfileError
from reshardctl.site.hostlist import MAX_HOSTS, expand_hostlist
from reshardctl.site.spec import (
    GPU_BIND_RE,
    LANDING_US_PER_PARAM,
    MAX_SIGNAL_S,
    MAX_SIZE_BYTES,
    MEMORY_KEYS,
    RANK_SIGNALS,
    RESOURCE_KEYS,
    RoleResources,
    signal_parts,
    size_bytes,
    LAUNCHERS,
    LOADER_US_PER_TENSOR,
    ROLES,
    MAX_BANDWIDTH,
    MAX_GPUS_PER_NODE,
    MAX_SECONDS,
    SLURM_MODES,
    TRANSPORTS,
    bucket_mb_problem,
    LinkSpec,
    NcclSpec,
    RefitSpec,
    SiteProfile,
    SlurmSpec,
    domain_message,
)

REQUIRED = object()


@dataclass(frozen=True)
class Key:
    kind: str  # float | int | bool | str | size | strlist | strmap | nodes | section | partitions
    default: Any = None
    form: str = ""  # the expected form, for messages: "a number of GB/s, e.g. 450"
    low: float | None = None  # lower bound
    strict: bool = False  # low is exclusive
    high: float | None = None  # upper bound (inclusive): later arithmetic stays exact and finite


LINKS = {
    "nvlink_gbytes_per_s": Key("float", REQUIRED, "a number of GB/s per GPU per direction, e.g. 450", 0, True, MAX_BANDWIDTH),
    "nic_gbits_per_s": Key("float", REQUIRED, "a number of Gbit/s per NIC per direction, e.g. 400", 0, True, MAX_BANDWIDTH),
    "nics_per_node": Key("int", 1, "a whole number of NICs (rails) per node, e.g. 8", 1, high=MAX_GPUS_PER_NODE),
    "nvlink_latency_us": Key("float", 2.0, "a number of microseconds, e.g. 2", 0, high=MAX_SECONDS * 1e6),
    "nic_latency_us": Key("float", 5.0, "a number of microseconds, e.g. 5", 0, high=MAX_SECONDS * 1e6),
    "nvlink_efficiency": Key("float", 0.84, "a fraction of the NVLink figure reached by large messages, e.g. 0.84", 0, True, 1.0),
    "nic_efficiency": Key("float", 0.94, "a fraction of the NIC figure reached by large messages, e.g. 0.94", 0, True, 1.0),
    "launch_us": Key("float", None, "a number of microseconds per grouped operation, e.g. 3", 0, high=MAX_SECONDS * 1e6),
    "mem_gbytes_per_s": Key("float", 2000.0, "a number of GB/s of GPU (or host) memory bandwidth, e.g. 3350", 0, True, MAX_BANDWIDTH),
    "checksum_gbytes_per_s": Key("float", None, "a number of GB/s checksummed by one rank, e.g. 800", 0, True, MAX_BANDWIDTH),
    "landing_us_per_param": Key("float", LANDING_US_PER_PARAM, "microseconds of host time per parameter segment landed "
                                "directly (one _foreach_copy_ of every segment), e.g. 1.5", 0, high=MAX_SECONDS * 1e6),
    "loader_us_per_tensor": Key("float", LOADER_US_PER_TENSOR, "microseconds of host time per HF tensor through a "
                                "framework loader call (vLLM's weight_loader), e.g. 20", 0, high=MAX_SECONDS * 1e6),
}
PARTITIONS = {role: Key("str", None, "a partition name") for role in ROLES}
SLURM = {
    "partitions": Key("partitions", None, "a mapping {train: <partition>, infer: <partition>}"),
    "partition": Key("str", None, "a partition name (shorthand for both roles)"),
    "account": Key("str", None, "an account name"),
    "qos": Key("str", None, "a QOS name"),
    "time_min": Key("int", 30, "a whole number of minutes, e.g. 30", 1, high=MAX_SECONDS // 60),
    "constraint": Key("str", None, "a Slurm constraint expression, e.g. 'h100&ib'"),
    "gpus_per_node": Key("int", None, "a whole number of GPUs, e.g. 8", 0, high=MAX_GPUS_PER_NODE),
    "container_image": Key("str", None, "an image name or path"),
    "container_mounts": Key("strlist", (), "a list of strings, e.g. ['/scratch:/scratch']"),
    "modules": Key("strlist", (), "a list of module names, e.g. ['cuda/12.4']"),
    "env": Key("strmap", {}, "a mapping of NAME: value, e.g. {NCCL_IB_HCA: mlx5}"),
    "extra_sbatch": Key("strlist", (), "a list of sbatch flags, e.g. ['--exclusive']"),
    "setup": Key("strlist", (), "a list of shell lines"),
    "mode": Key("str", "hetjob", "one of " + ", ".join(SLURM_MODES)),
    "python": Key("str", None, "the ranks' Python interpreter, e.g. /shared/venv/bin/python"),
    "port_min": Key("int", 1400, "a TCP port number, e.g. 1400", 1024, high=65535),
    "port_max": Key("int", 1999, "a TCP port number, e.g. 1999", 1024, high=65535),
    "extra_srun": Key("strlist", (), "a list of srun flags, e.g. ['--mpi=pmix']"),
    "peer_wait_s": Key("int", 1800, "a whole number of seconds, e.g. 1800", 1, high=MAX_SECONDS),
    "cpus_per_task": Key("int", None, "a whole number of CPUs per rank, e.g. 8 (--cpus-per-task)", 1, high=4096),
    "mem": Key("size", None, "memory per node in Slurm's size syntax, e.g. 256G or 500M (--mem; 0: all of it)"),
    "mem_per_cpu": Key("size", None, "memory per CPU in Slurm's size syntax, e.g. 8G (--mem-per-cpu)"),
    "gpus_per_task": Key("int", None, "1: one GPU per rank (--gpus-per-task=1, instead of --gpus-per-node)", 1, high=1),
    "gpu_bind": Key("str", None, "a Slurm GPU binding: none, closest, single:N, per_task:N, map_gpu:L or mask_gpu:L"),
    "resources": Key("resources", None, "a mapping {train: {...}, infer: {...}} of per-role resource keys"),
    "signal": Key("str", None, "SIGNAL@SECONDS before the time limit, sent to the ranks, e.g. USR1@120"),
    "requeue": Key("bool", None, "true (--requeue) or false (--no-requeue)"),
    "container_expand": Key("bool", False, "true: ${NAME} in container_mounts is expanded by the job script"),
}
ROLE_RESOURCES = {k: SLURM[k] for k in RESOURCE_KEYS}
RESOURCES = {role: Key("section", None, f"a mapping of {role} resource keys ({', '.join(RESOURCE_KEYS)})")
             for role in ROLES}
REFIT = {
    "transport": Key("str", "reshard", "one of " + ", ".join(TRANSPORTS)),
    "latency_budget_s": Key("float", 30.0, "a number of seconds, e.g. 30", 0, True, MAX_SECONDS),
    "bucket_mb": Key("float", 256.0, "a number of MiB, e.g. 256", 0, True),  # bounds: spec.bucket_mb_problem
    "timeout_s": Key("float", 300.0, "a number of seconds, e.g. 300", 0, True, MAX_SECONDS),
    "rendezvous_timeout_s": Key("float", 120.0, "a number of seconds, e.g. 120", 0, True, MAX_SECONDS),
}
NCCL = {
    "buffsize_mb": Key("float", 4.0, "a number of MiB, e.g. 4 (NCCL_BUFFSIZE)", 0, True, 1024),
    "max_channels": Key("int", 32, "a whole number of channels, e.g. 16 (NCCL_MAX_NCHANNELS)", 1, high=64),
    "p2p_channels_per_peer": Key("int", 2, "a whole number of channels, e.g. 2 (NCCL_NCHANNELS_PER_NET_PEER)", 1,
                                 high=64),
}
TOP = {
    "site": Key("str", None, "a name made of letters, digits, '.', '_' and '-'"),
    "nodes": Key("nodes", REQUIRED, "a node count (e.g. 4), a hostlist ('gpu[001-032]') or a list of names"),
    "gpus_per_node": Key("int", REQUIRED, "a whole number of GPUs (ranks) per node, e.g. 8", 1, high=MAX_GPUS_PER_NODE),
    "nvlink_domain_nodes": Key("int", 1, "a whole number of nodes per NVLink domain, e.g. 1 or 18", 1, high=MAX_HOSTS),
    "cpu_only": Key("bool", False, "true or false"),
    "gpu_memory_gib": Key("float", None, "a number of GiB of memory per GPU, e.g. 79.6 (an H100 80GB)", 0, True, 65536),
    "launcher": Key("str", "local", "one of " + ", ".join(LAUNCHERS)),
    "measured": Key("str", None, "a calibration file written by `reshardctl calibrate --out FILE`"),
    "links": Key("section", REQUIRED, "a mapping (the links: section)"),
    "slurm": Key("section", None, "a mapping (the slurm: section)"),
    "refit": Key("section", None, "a mapping (the refit: section)"),
    "nccl": Key("section", None, "a mapping (the nccl: section)"),
    "state_dir": Key("str", None, "a directory path for the site's ledger, e.g. /shared/reshardctl-state"),
}
SECTIONS = {"": TOP, "links.": LINKS, "slurm.": SLURM, "slurm.partitions.": PARTITIONS,
            "slurm.resources.": RESOURCES, "slurm.resources.train.": ROLE_RESOURCES,
            "slurm.resources.infer.": ROLE_RESOURCES, "refit.": REFIT, "nccl.": NCCL}
ALL_PATHS = [prefix + k for prefix, keys in SECTIONS.items() for k in keys]

MAX_NAME = 128  # characters of a site name (it names files)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXPONENT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")  # 4e2, 4.0e2, 4e+2, 4.0e+2 (quoted)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlong = 40
_SHORT.maxlevel = 3
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6


def short(value: Any) -> str:
    """``repr`` bounded in length however big or deep the value (reprlib never walks the whole value)."""
    text = _SHORT.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe(value: Any) -> str:
    """The value as given, shortened, with a friendly type name: ``'fast' (a string)``."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             tuple: "a list", dict: "a mapping", type(None): "null"}
    kind = names.get(type(value)) or ("a mapping" if isinstance(value, Mapping) else type(value).__name__)
    return f"{short(value)} ({kind})"


class _Collector:
    def __init__(self, source: str):
        self.source = source
        self.problems: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.problems.append(f"`{path}`: {msg}" if path else msg)

    def wrong_type(self, path: str, key: Key, value: Any) -> None:
        hint = ""
        if isinstance(value, str) and key.kind in ("float", "int"):
            try:
                float(value)
                # the value is text that reads as a number: quoted, or a form the loader does not
                # take as a number (phrased for both: the data no longer says which it was)
                hint = "; give it as a plain number (e.g. 400), not as quoted text"
                if _EXPONENT_RE.fullmatch(value.strip()):
                    hint = ("; YAML (PyYAML) reads an exponent as a number only with a dot in the mantissa "
                            "and a sign in the exponent, so this is text: write e.g. 400 or 4.0e+2")
            except ValueError:
                hint = "; give the number alone, in the unit of the key name"
        self.add(path, f"expected {key.form}, got {describe(value)}{hint}")

    def unknown(self, prefix: str, key: Any, known: Mapping[str, Key]) -> None:
        if not isinstance(key, str):
            self.add(prefix + short(key), f"keys must be strings, got {describe(key)}")
            return
        path = prefix + (key if len(key) <= 80 else short(key))
        match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        if match:
            self.add(path, f"unknown key; did you mean `{prefix + match[0]}`?")
            return
        # a known key in the wrong section ("nvlink_gbytes_per_s" at the top level)
        leaves = {p.rsplit(".", 1)[-1]: p for p in ALL_PATHS if not p.startswith(prefix) or p.count(".") != prefix.count(".")}
        match = difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.75)
        if match:
            self.add(path, f"unknown key here; did you mean `{leaves[match[0]]}` (another section)?")
        else:
            self.add(path, f"unknown key (known here: {', '.join(known)})")


def _section(c: _Collector, data: Any, prefix: str, schema: Mapping[str, Key]) -> dict[str, Any]:
    """Check one mapping's keys; return the raw values of the known keys (null dropped)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        c.add(prefix.rstrip("."), f"expected a mapping of keys, got {describe(data)}")
        return {}
    out = {}
    for key, value in data.items():
        if key not in schema:
            c.unknown(prefix, key, schema)
        elif value is not None:
            out[key] = value
    for key, spec in schema.items():
        if spec.default is REQUIRED and key not in out:
            c.add(prefix + key, f"required key is missing (expected {spec.form})")
    return out


def _value(c: _Collector, raw: Mapping[str, Any], prefix: str, key: str, spec: Key) -> Any:
    """One scalar/list/map value, type-checked; the default when absent or wrong (a problem is recorded)."""
    path = prefix + key
    default = None if spec.default is REQUIRED else spec.default
    if key not in raw:
        return default
    v = raw[key]
    if spec.kind in ("float", "int"):
        ok = isinstance(v, int) and not isinstance(v, bool)
        if spec.kind == "float":
            ok = ok or isinstance(v, float)
        if not ok:
            if spec.kind == "int" and isinstance(v, float) and not isinstance(v, bool):
                c.add(path, f"expected {spec.form} (a whole number), got {describe(v)}")
            else:
                c.wrong_type(path, spec, v)
            return default
        if spec.kind == "float" and not math.isfinite(v):
            c.add(path, f"expected {spec.form}, got {describe(v)} (not a finite number)")
            return default
        if spec.low is not None and (v <= spec.low if spec.strict else v < spec.low):
            c.add(path, f"must be {'>' if spec.strict else '>='} {spec.low:g}, got {short(v)}")
            return default
        if spec.high is not None and v > spec.high:
            c.add(path, f"must be <= {spec.high:g} (the limit for this key), got {short(v)}")
            return default
        return float(v) if spec.kind == "float" else int(v)
    if spec.kind == "bool":
        if not isinstance(v, bool):
            c.wrong_type(path, spec, v)
            return default
        return v
    if spec.kind == "size" and isinstance(v, int) and not isinstance(v, bool):
        v = str(v)  # `mem: 0`, `mem: 4000` (MiB): Slurm's own plain form
    if spec.kind in ("str", "size"):
        if not isinstance(v, str):
            c.wrong_type(path, spec, v)
            return default
        if not v.strip():
            c.add(path, f"is empty (expected {spec.form})")
            return default
        if "\x00" in v:
            c.add(path, "holds a NUL byte (no shell or Slurm value can carry one)")
            return default
        return v
    if spec.kind == "strlist":
        if not isinstance(v, (list, tuple)):
            c.wrong_type(path, spec, v)
            return default
        bad = [i for i, item in enumerate(v) if not isinstance(item, str)]
        for i in bad:
            c.add(f"{path}[{i}]", f"expected a string, got {describe(v[i])}")
        nul = [i for i, item in enumerate(v) if isinstance(item, str) and "\x00" in item]
        for i in nul:
            c.add(f"{path}[{i}]", "holds a NUL byte (no shell or Slurm value can carry one)")
        return tuple(v) if not (bad or nul) else default
    if spec.kind == "strmap":
        if not isinstance(v, Mapping):
            c.wrong_type(path, spec, v)
            return default
        out = {}
        for name, val in v.items():
            if not isinstance(name, str) or not _ENV_RE.match(name):
                c.add(f"{path}", f"{describe(name)} is not a valid environment variable name")
            elif len(name) > MAX_NAME:
                c.add(f"{path}", f"{describe(name)} is longer than {MAX_NAME} characters")
            elif isinstance(val, bool) or not isinstance(val, (str, int)):
                c.add(f"{path}.{name}", f"expected a string (quote it, e.g. '1'), got {describe(val)}")
            elif isinstance(val, str) and "\x00" in val:
                c.add(f"{path}.{name}", "holds a NUL byte (no shell or Slurm value can carry one)")
            else:
                out[name] = str(val)
        return out
    raise AssertionError(spec.kind)  # pragma: no cover


def _nodes(c: _Collector, raw: Mapping[str, Any]) -> tuple[str, ...]:
    if "nodes" not in raw:
        return ()
    v = raw["nodes"]
    form = TOP["nodes"].form
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            c.add("nodes", f"node count must be >= 1, got {v}")
            return ()
        if v > MAX_HOSTS:  # checked before any name is built (10**20 nodes would exhaust memory)
            c.add("nodes", f"node count {v} is more than the maximum of {MAX_HOSTS} nodes (MAX_HOSTS)")
            return ()
        width = max(3, len(str(v)))
        return tuple(f"node{i:0{width}d}" for i in range(1, v + 1))
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)):
        c.add("nodes", f"expected {form}, got {describe(v)}")
        return ()
    names: list[str] = []
    for i, item in enumerate(items):
        path = "nodes" if isinstance(v, str) else f"nodes[{i}]"
        if not isinstance(item, str):
            c.add(path, f"expected a host name or hostlist, got {describe(item)}")
            continue
        if len(names) >= MAX_HOSTS:
            c.add("nodes", f"lists more than the maximum of {MAX_HOSTS} nodes (MAX_HOSTS) in all")
            return ()
        try:  # the budget left for this item: the list's total is bounded too, before names are built
            names.extend(expand_hostlist(item, MAX_HOSTS - len(names)))
        except ProfileError as exc:
            c.add(path, exc.message)
            if "MAX_HOSTS" in exc.message:  # over the limit: stop, the rest cannot fit either
                return ()
    dups = sorted(n for n, k in Counter(names).items() if k > 1)
    if dups:
        c.add("nodes", f"lists {', '.join(dups[:5])}{' ...' if len(dups) > 5 else ''} more than once")
    if not isinstance(v, str) and isinstance(v, (list, tuple)) and not v:
        c.add("nodes", "is an empty list")
    return tuple(names)


_MOUNT_VAR = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def _mounts(c: _Collector, slurm: dict) -> None:
    """``container_mounts``: one mount per item (no comma: pyxis splits the list on commas); a ``$`` is
    either a ``${NAME}`` the job script expands (``container_expand: true``) or refused: written literally,
    pyxis would mount a path named ``$USER``."""
    for i, m in enumerate(slurm["container_mounts"]):
        path = f"slurm.container_mounts[{i}]"
        if "," in m or "\n" in m or "\r" in m or not m.strip():
            c.add(path, f"{short(m)}: one mount per item, SRC:DST[:FLAGS], without commas or newlines")
        elif "$" in m and not slurm["container_expand"]:
            c.add(path, f"{short(m)} holds '$', which pyxis would take literally: to have the job script expand a "
                        "variable, write it ${NAME} (e.g. /home/${USER}) and set slurm.container_expand: true")
        elif "$" in _MOUNT_VAR.sub("", m):
            c.add(path, f"{short(m)}: only ${{NAME}} is expanded (container_expand); any other '$' (a bare $NAME, "
                        "$(...)) is refused")


def _resource_values(c: _Collector, vals: dict, prefix: str) -> None:
    """Check one mapping's resource values in place (a bad one: recorded, then None)."""
    for k in MEMORY_KEYS:
        v = vals.get(k)
        if v is None:
            continue
        n = size_bytes(v.strip().upper())
        if n is None:
            c.add(prefix + k, f"{short(v)} is not a Slurm size: a whole number with an optional unit K, M, G or T "
                              "(powers of 1024; no unit = M), e.g. 64G or 500M")
            vals[k] = None
        elif n > MAX_SIZE_BYTES:
            c.add(prefix + k, f"{short(v)} = {n} bytes is more than the limit of {MAX_SIZE_BYTES} bytes (1 PiB)")
            vals[k] = None
        elif n == 0 and k == "mem_per_cpu":
            c.add(prefix + k, "must be more than 0 (`mem: 0` asks for all of a node's memory)")
            vals[k] = None
        else:
            vals[k] = v.strip().upper()
    if vals.get("mem") is not None and vals.get("mem_per_cpu") is not None:
        c.add(prefix + "mem_per_cpu", f"give `{prefix}mem` ({vals['mem']}, per node) or `{prefix}mem_per_cpu` "
                                      f"({vals['mem_per_cpu']}, per CPU), not both (sbatch refuses both)")
        vals["mem_per_cpu"] = None
    bind = vals.get("gpu_bind")
    if bind is not None and not GPU_BIND_RE.match(bind):
        c.add(prefix + "gpu_bind", f"{short(bind)} is not a GPU binding sbatch takes: none, closest, single:N, "
                                   "per_task:N, map_gpu:LIST or mask_gpu:LIST (optionally after 'verbose,')")
        vals["gpu_bind"] = None


def _role_resources(c: _Collector, sraw: Mapping[str, Any], slurm: dict) -> dict[str, RoleResources]:
    """``slurm.resources.<role>``: each role's overrides, checked; a het job's components must ask memory the
    same way (sbatch refuses --mem in one component and --mem-per-cpu in the other)."""
    out: dict[str, RoleResources] = {}
    if "resources" in sraw:
        rraw = _section(c, sraw["resources"], "slurm.resources.", RESOURCES)
        for role in ROLES:
            if role not in rraw:
                continue
            prefix = f"slurm.resources.{role}."
            vraw = _section(c, rraw[role], prefix, ROLE_RESOURCES)
            vals = {k: _value(c, vraw, prefix, k, spec) for k, spec in ROLE_RESOURCES.items()}
            _resource_values(c, vals, prefix)
            out[role] = RoleResources(**vals)
    base = {k: slurm.get(k) for k in RESOURCE_KEYS}
    kinds = {}
    for role in ROLES:
        own = out.get(role)
        merged = own.over(RoleResources(**base)) if own is not None else RoleResources(**base)
        kind = next((k for k in MEMORY_KEYS if getattr(merged, k) is not None), None)
        if kind is not None:
            kinds[role] = kind
    if len(set(kinds.values())) > 1:
        c.add("slurm.resources", f"the trainer tasks ask memory with `{kinds['train']}` but the inference tasks with "
                                 f"`{kinds['infer']}`: use the same key for both roles (sbatch refuses --mem in "
                                 "one het-job component and --mem-per-cpu in the other)")
    return out


def _signal(c: _Collector, slurm: dict) -> None:
    text = slurm.get("signal")
    if text is None:
        return
    parts = signal_parts(text.strip().upper())
    if parts is None or parts[0] not in RANK_SIGNALS:
        c.add("slurm.signal", f"{short(text)}: expected SIGNAL@SECONDS with SIGNAL one of {', '.join(RANK_SIGNALS)} "
                              "(the signals the ranks handle; Slurm sends it to every rank), e.g. USR1@120")
        slurm["signal"] = None
        return
    name, secs = parts
    limit = (slurm.get("time_min") or SLURM["time_min"].default) * 60
    if not 1 <= secs <= MAX_SIGNAL_S:
        c.add("slurm.signal", f"{short(text)}: the seconds before the limit must be 1..{MAX_SIGNAL_S}, got {secs}")
        slurm["signal"] = None
    elif secs >= limit:
        c.add("slurm.signal", f"{short(text)} is sent {secs} s before the time limit, but slurm.time_min is "
                              f"{limit // 60} min = {limit} s: {secs} >= {limit}, the signal would come at the start")
        slurm["signal"] = None
    else:
        slurm["signal"] = f"{name}@{secs}"


def _default_name(source: str) -> str:
    if source.startswith("builtin:"):
        return source[len("builtin:"):]
    return PurePath(source).stem or "site"


def parse_profile(data: Mapping, source: str) -> SiteProfile:
    """Validate a profile mapping (as read from YAML or TOML) and build the ``SiteProfile``.

    ``source`` names where the data came from (a path or ``builtin:<name>``); it heads every message.
    Raises one ``ProfileError`` listing every problem found.
    """
    c = _Collector(source)
    if not isinstance(data, Mapping):
        raise ProfileError(f"site profile {source}: expected a mapping of keys at the top level, got {describe(data)}")
    top = _section(c, data, "", TOP)
    name = _value(c, top, "", "site", TOP["site"]) or _default_name(source)
    if not _NAME_RE.match(name) or len(name) > MAX_NAME:
        c.add("site", f"{short(name)} is not a valid site name ({TOP['site'].form}, at most {MAX_NAME} characters)")
    nodes = _nodes(c, top)
    gpus = _value(c, top, "", "gpus_per_node", TOP["gpus_per_node"])
    domain = _value(c, top, "", "nvlink_domain_nodes", TOP["nvlink_domain_nodes"])
    cpu_only = _value(c, top, "", "cpu_only", TOP["cpu_only"])
    state_dir = _value(c, top, "", "state_dir", TOP["state_dir"])
    gpu_memory_gib = _value(c, top, "", "gpu_memory_gib", TOP["gpu_memory_gib"])
    launcher = _value(c, top, "", "launcher", TOP["launcher"])
    if launcher not in LAUNCHERS:
        c.add("launcher", f"must be one of {', '.join(LAUNCHERS)}, got {short(launcher)}")
        launcher = "local"
    measured = _value(c, top, "", "measured", TOP["measured"])

    lraw = _section(c, top.get("links"), "links.", LINKS) if "links" in top else {}
    links = {k: _value(c, lraw, "links.", k, spec) for k, spec in LINKS.items()}
    for k in ("nvlink_efficiency", "nic_efficiency"):
        if links[k] is not None and links[k] > 1:
            c.add(f"links.{k}", f"must be a fraction <= 1 of the link figure, got {links[k]!r}")
            links[k] = LINKS[k].default

    sraw = _section(c, top.get("slurm"), "slurm.", SLURM)
    slurm = {k: _value(c, sraw, "slurm.", k, spec) for k, spec in SLURM.items()
             if spec.kind not in ("partitions", "resources")}
    partitions: dict[str, str] = {}
    if "partitions" in sraw:
        praw = _section(c, sraw["partitions"], "slurm.partitions.", PARTITIONS)
        partitions = {r: v for r in ROLES if (v := _value(c, praw, "slurm.partitions.", r, PARTITIONS[r]))}
        if "partition" in sraw:
            c.add("slurm.partition", "give either `slurm.partition` (both roles) or `slurm.partitions`, not both")
    elif slurm.get("partition"):
        partitions = {r: slurm["partition"] for r in ROLES}
    slurm.pop("partition")

    rraw = _section(c, top.get("refit"), "refit.", REFIT)
    refit = {k: _value(c, rraw, "refit.", k, spec) for k, spec in REFIT.items()}
    bucket = bucket_mb_problem(refit["bucket_mb"]) if "bucket_mb" in rraw else None
    if bucket:
        c.add("refit.bucket_mb", bucket)
        refit["bucket_mb"] = REFIT["bucket_mb"].default
    if refit["transport"] not in TRANSPORTS:
        match = difflib.get_close_matches(refit["transport"], TRANSPORTS, n=1)
        hint = f"; did you mean {match[0]!r}?" if match else ""
        c.add("refit.transport", f"must be one of {', '.join(TRANSPORTS)}, got {short(refit['transport'])}{hint}")

    nraw = _section(c, top.get("nccl"), "nccl.", NCCL)
    nccl = {k: _value(c, nraw, "nccl.", k, spec) for k, spec in NCCL.items()}

    # cross-field arithmetic (only with values that passed their own checks)
    if nodes and domain and len(nodes) % domain:
        c.add("nvlink_domain_nodes", domain_message(len(nodes), domain))
    if slurm["gpus_per_node"] is None and not cpu_only and gpus:
        slurm["gpus_per_node"] = gpus
    elif slurm["gpus_per_node"] is not None and gpus and not cpu_only and slurm["gpus_per_node"] < gpus:
        c.add("slurm.gpus_per_node", f"requests {slurm['gpus_per_node']} GPUs per node, but gpus_per_node is {gpus}: "
              "every rank needs its GPU (set cpu_only: true for CPU ranks)")
    for i, flag in enumerate(slurm["extra_sbatch"]):
        if flag.lstrip().upper().startswith("#SBATCH"):
            c.add(f"slurm.extra_sbatch[{i}]", f"give the flag without '#SBATCH': {short(flag.split(None, 1)[-1])}")
        elif not flag.startswith("-") or "\n" in flag or "\r" in flag:
            c.add(f"slurm.extra_sbatch[{i}]", f"expected one sbatch flag such as '--exclusive', got {short(flag)}")
    for i, flag in enumerate(slurm["extra_srun"]):
        if not flag.startswith("-") or "\n" in flag or "\r" in flag:
            c.add(f"slurm.extra_srun[{i}]", f"expected one srun flag such as '--mpi=pmix', got {short(flag)}")
    for i, line in enumerate(slurm["setup"]):
        if "\n" in line or "\r" in line:
            c.add(f"slurm.setup[{i}]", "one shell line per item (no newline inside an item)")
    if slurm["mode"] not in SLURM_MODES:
        c.add("slurm.mode", f"must be one of {', '.join(SLURM_MODES)}, got {short(slurm['mode'])}")
        slurm["mode"] = "hetjob"
    _mounts(c, slurm)
    _resource_values(c, slurm, "slurm.")
    slurm["resources"] = _role_resources(c, sraw, slurm)
    _signal(c, slurm)
    if slurm["port_max"] > 65535 or slurm["port_min"] > 65535:
        c.add("slurm.port_max", f"TCP ports end at 65535 (got {slurm['port_min']}..{slurm['port_max']})")
    elif slurm["port_min"] > slurm["port_max"]:
        c.add("slurm.port_min", f"port_min ({slurm['port_min']}) is above port_max ({slurm['port_max']})")

    if c.problems:
        if len(c.problems) == 1:
            raise ProfileError(f"site profile {source}: {c.problems[0]}")
        raise ProfileError(
            f"site profile {source}: {len(c.problems)} problems:\n" + "\n".join(f"  - {p}" for p in c.problems)
        )
    return SiteProfile(
        name=name,
        source=source,
        nodes=nodes,
        gpus_per_node=gpus,
        nvlink_domain_nodes=domain,
        links=LinkSpec(**links),
        cpu_only=cpu_only,
        launcher=launcher,
        slurm=SlurmSpec(partitions=partitions, **slurm),
        refit=RefitSpec(**refit),
        nccl=NcclSpec(**nccl),
        measured=measured,
        state_dir=state_dir,
        gpu_memory_gib=gpu_memory_gib,
    )
