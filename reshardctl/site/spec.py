"""The immutable value objects of a site profile, and their resolved dict form.

Objects are built by ``parse_profile`` (which checks types and collects every problem of a file), but they
also check their own invariants on construction, so code that builds one by hand cannot make an impossible
site either. Mappings are stored as ``FrozenMap`` and sequences as tuples: a profile is hashable,
picklable and cannot be changed after loading.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from reshardctl.errors import ProfileError

TRANSPORTS = ("reshard", "gather_broadcast", "hybrid")
ROLES = ("train", "infer")
LAUNCHERS = ("local", "slurm")
SLURM_MODES = ("hetjob", "two-jobs")
MIB = 2**20
# upper bounds of profile numbers: beyond them later arithmetic (bytes as int64, timeouts, node lists)
# overflows or means nothing; docs/site-profiles.md "Input limits"
MAX_GPUS_PER_NODE = 1024
MAX_BANDWIDTH = 1e6  # GB/s or Gbit/s
MAX_SECONDS = 7 * 24 * 3600  # timeouts, budgets, Slurm time limits: one week
BUCKET_MB_MAX = 1 << 20  # 1 TiB
BUCKET_MB_MIN = 1 / MIB  # one byte


def bucket_mb_problem(mb: float) -> str | None:
    """Why ``mb`` MiB is not a usable bucket, with the arithmetic (None when it is). The one check for
    ``refit.bucket_mb`` (``profile validate``, ``RefitSpec``) and ``--bucket-mb`` (``plan``/``run``)."""
    if isinstance(mb, bool) or not isinstance(mb, (int, float)):
        return f"expected a number of MiB, got {type(mb).__name__}"
    if not math.isfinite(mb) or mb <= 0:
        return f"must be a finite number of MiB > 0, got {mb:g}"
    if int(mb * MIB) < 1:
        return (f"{mb:g} MiB x {MIB} bytes/MiB = {mb * MIB:.3g} bytes, less than one byte "
                f"(at least {BUCKET_MB_MIN:.3g} MiB)")
    if mb > BUCKET_MB_MAX:
        return f"{mb:g} MiB is more than the limit of {BUCKET_MB_MAX} MiB (1 TiB)"
    return None


class FrozenMap(Mapping[str, str]):
    """A read-only, hashable, picklable ``str -> str`` mapping that keeps insertion order."""

    __slots__ = ("_d",)

    def __init__(self, data: Mapping[str, str] | None = None):
        object.__setattr__(self, "_d", dict(data or {}))

    def __getitem__(self, key: str) -> str:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._d.items())))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is read-only")

    def __reduce__(self):
        return (FrozenMap, (self._d,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"


def _freeze(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _raise(problems: list[str], what: str) -> None:
    if problems:
        if len(problems) == 1:
            raise ProfileError(f"{what}: {problems[0]}")
        raise ProfileError(f"{what}: {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


# Landing defaults (docs/cost-model.md "Landing"): host seconds measured on this repository's 2-core CPU
# machine by `reshardctl calibrate --site local` (calibrate/landing.py host_cost; benchmarks/landing.py
# agrees on real plans), never fitted to published refit times. A site's calibration replaces them.
LANDING_US_PER_PARAM = 1.5
LOADER_US_PER_TENSOR = 20.0


@dataclass(frozen=True)
class LinkSpec:
    """Link figures of one site. Bandwidths per direction; latencies per message."""

    nvlink_gbytes_per_s: float  # NVLink bandwidth per GPU per direction, GB/s (1e9 bytes)
    nic_gbits_per_s: float  # per NIC per direction, Gbit/s
    nics_per_node: int = 1  # rails per node
    nvlink_latency_us: float = 2.0
    nic_latency_us: float = 5.0
    # cost-model figures (docs/cost-model.md says where each default comes from)
    nvlink_efficiency: float = 0.84  # achievable fraction of NVLink for large messages (380 of 450 GB/s)
    nic_efficiency: float = 0.94  # achievable fraction of a NIC for large messages (47 of 50 GB/s)
    launch_us: float | None = None  # per grouped operation (one kernel); None: nvlink_latency_us
    mem_gbytes_per_s: float = 2000.0  # memory bandwidth of a rank (pack/unpack copies read + write)
    checksum_gbytes_per_s: float | None = None  # None: mem_gbytes_per_s / 4 (checksum.py reads 4 words per word)
    landing_us_per_param: float = LANDING_US_PER_PARAM  # host time per segment landed directly (docs/cost-model.md)
    loader_us_per_tensor: float = LOADER_US_PER_TENSOR  # host time per HF tensor through a framework's loader call

    def __post_init__(self) -> None:
        p = []
        for k in ("nvlink_gbytes_per_s", "nic_gbits_per_s", "mem_gbytes_per_s"):
            if not getattr(self, k) > 0:
                p.append(f"links.{k} must be > 0, got {getattr(self, k)!r}")
        if not self.nics_per_node >= 1:
            p.append(f"links.nics_per_node must be >= 1, got {self.nics_per_node!r}")
        for k in ("nvlink_latency_us", "nic_latency_us"):
            if not getattr(self, k) >= 0:
                p.append(f"links.{k} must be >= 0, got {getattr(self, k)!r}")
        for k in ("nvlink_efficiency", "nic_efficiency"):
            if not 0 < getattr(self, k) <= 1:
                p.append(f"links.{k} must be a fraction in (0, 1], got {getattr(self, k)!r}")
        if self.launch_us is not None and not self.launch_us >= 0:
            p.append(f"links.launch_us must be >= 0, got {self.launch_us!r}")
        for k in ("landing_us_per_param", "loader_us_per_tensor"):
            if not getattr(self, k) >= 0:
                p.append(f"links.{k} must be >= 0, got {getattr(self, k)!r}")
        if self.checksum_gbytes_per_s is not None and not self.checksum_gbytes_per_s > 0:
            p.append(f"links.checksum_gbytes_per_s must be > 0, got {self.checksum_gbytes_per_s!r}")
        _raise(p, "invalid LinkSpec")

    @property
    def nvlink_bytes_per_s(self) -> float:
        """NVLink bytes/s per GPU per direction."""
        return self.nvlink_gbytes_per_s * 1e9

    @property
    def nic_bytes_per_s(self) -> float:
        """Bytes/s of one NIC per direction."""
        return self.nic_gbits_per_s * 1e9 / 8

    @property
    def node_nic_bytes_per_s(self) -> float:
        """Bytes/s of all NICs (rails) of one node per direction."""
        return self.nic_bytes_per_s * self.nics_per_node


# Slurm's size syntax (--mem, --mem-per-cpu): a whole number, unit K, M (the default), G or T (powers of 1024)
SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SIZE_BYTES = 1 << 50  # 1 PiB: beyond any node
_SIZE_RE = re.compile(r"^([0-9]{1,16})([KMGT]?)$")
# the signals the ranks handle (runtime/time_limit.py); Slurm sends them sig_time seconds before the limit
RANK_SIGNALS = ("USR1", "USR2")
MAX_SIGNAL_S = 65535  # Slurm's bound on sig_time
_SIGNAL_RE = re.compile(r"^(?:SIG)?([A-Z0-9]+)@([0-9]{1,6})$")
GPU_BIND_RE = re.compile(r"^(?:verbose,)?(?:none|closest|single:[1-9][0-9]*|per_task:[1-9][0-9]*|"
                         r"map_gpu:[0-9*,]+|mask_gpu:[0-9a-fA-Fx*,]+)$")


def size_bytes(text: str) -> int | None:
    """Bytes of a Slurm size (``64G``, ``500M``, ``4000`` = 4000 MiB), None when ``text`` is not one."""
    m = _SIZE_RE.match(str(text))
    return None if m is None else int(m.group(1)) * SIZE_UNITS[m.group(2) or "M"]


def signal_parts(text: str) -> tuple[str, int] | None:
    """``("USR1", 120)`` for ``USR1@120`` (or ``SIGUSR1@120``); None when ``text`` has another form."""
    m = _SIGNAL_RE.match(str(text))
    return None if m is None else (m.group(1), int(m.group(2)))


RESOURCE_KEYS = ("cpus_per_task", "mem", "mem_per_cpu", "gpus_per_task", "gpu_bind")
MEMORY_KEYS = ("mem", "mem_per_cpu")


@dataclass(frozen=True)
class RoleResources:
    """What each task (rank) of one role asks Slurm for; None: no flag (the cluster's default). Memory is
    per node (``mem``) or per CPU (``mem_per_cpu``), in Slurm's size syntax (``64G``, ``500M``)."""

    cpus_per_task: int | None = None
    mem: str | None = None
    mem_per_cpu: str | None = None
    gpus_per_task: int | None = None
    gpu_bind: str | None = None

    def __post_init__(self) -> None:
        p = []
        if self.mem is not None and self.mem_per_cpu is not None:
            p.append(f"give `mem` ({self.mem}, per node) or `mem_per_cpu` ({self.mem_per_cpu}), not both "
                     "(sbatch: --mem and --mem-per-cpu are mutually exclusive)")
        if self.cpus_per_task is not None and not self.cpus_per_task >= 1:
            p.append(f"cpus_per_task must be >= 1, got {self.cpus_per_task!r}")
        if self.gpus_per_task is not None and self.gpus_per_task != 1:
            p.append(f"gpus_per_task must be 1 (one GPU per rank, runtime/device.py), got {self.gpus_per_task!r}")
        _raise(p, "invalid RoleResources")

    def over(self, base: "RoleResources") -> "RoleResources":
        """These values where given, ``base``'s elsewhere; a memory key given here replaces both of base's."""
        vals = {k: getattr(base, k) for k in RESOURCE_KEYS}
        if any(getattr(self, k) is not None for k in MEMORY_KEYS):
            vals.update(mem=None, mem_per_cpu=None)
        vals.update({k: getattr(self, k) for k in RESOURCE_KEYS if getattr(self, k) is not None})
        return RoleResources(**vals)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in RESOURCE_KEYS if getattr(self, k) is not None}


@dataclass(frozen=True)
class SlurmSpec:
    """How to ask Slurm for nodes. Empty/None values mean "no such flag" (the cluster's default)."""

    partitions: Mapping[str, str] = field(default_factory=FrozenMap)  # role ("train"/"infer") -> partition
    account: str | None = None
    qos: str | None = None
    time_min: int = 30
    constraint: str | None = None
    gpus_per_node: int | None = None  # --gpus-per-node; None: no GPU request flag
    container_image: str | None = None
    container_mounts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=FrozenMap)
    extra_sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    mode: str = "hetjob"  # "hetjob" (one job, two components) | "two-jobs" (one job per role)
    python: str | None = None  # the ranks' Python; None: the one running reshardctl (a shared install)
    port_min: int = 1400  # rendezvous port range, below the ephemeral range of any common node set-up
    port_max: int = 1999
    extra_srun: tuple[str, ...] = ()
    peer_wait_s: int = 1800  # two jobs: how long the trainer job waits for the inference job to start
    # resources per task, for both roles (``resources`` overrides them per role); docs/site-profiles.md
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, Slurm size syntax (64G); 0: all of the node's memory
    mem_per_cpu: str | None = None
    gpus_per_task: int | None = None  # 1 (one GPU per rank): replaces --gpus-per-node
    gpu_bind: str | None = None  # --gpu-bind, e.g. single:1, closest, none
    resources: Mapping[str, RoleResources] = field(default_factory=FrozenMap)  # role -> overrides
    signal: str | None = None  # SIG@seconds before the time limit, sent to the ranks (--signal=USR1@120)
    requeue: bool | None = None  # --requeue / --no-requeue; None: the cluster's default
    container_expand: bool = False  # ${NAME} in container_mounts expanded by the job script

    def __post_init__(self) -> None:
        _freeze(self, "partitions", FrozenMap(self.partitions))
        _freeze(self, "resources", FrozenMap(self.resources))
        _freeze(self, "env", FrozenMap(self.env))
        for k in ("container_mounts", "modules", "extra_sbatch", "setup", "extra_srun"):
            _freeze(self, k, tuple(getattr(self, k)))
        p = []
        bad_roles = [r for r in self.partitions if r not in ROLES]
        if bad_roles:
            p.append(f"slurm.partitions has unknown roles {bad_roles} (roles: train, infer)")
        if not self.time_min >= 1:
            p.append(f"slurm.time_min must be >= 1 minute, got {self.time_min!r}")
        if self.gpus_per_node is not None and not self.gpus_per_node >= 0:
            p.append(f"slurm.gpus_per_node must be >= 0, got {self.gpus_per_node!r}")
        if self.mode not in SLURM_MODES:
            p.append(f"slurm.mode must be one of {', '.join(SLURM_MODES)}, got {self.mode!r}")
        if not 1024 <= self.port_min <= self.port_max <= 65535:
            p.append(f"slurm.port_min ({self.port_min}) <= slurm.port_max ({self.port_max}) must lie in 1024..65535")
        bad_roles = [r for r in self.resources if r not in ROLES]
        if bad_roles:
            p.append(f"slurm.resources has unknown roles {bad_roles} (roles: train, infer)")
        _raise(p, "invalid SlurmSpec")
        self.base_resources()  # checks the shared values too (RoleResources)

    def base_resources(self) -> RoleResources:
        return RoleResources(**{k: getattr(self, k) for k in RESOURCE_KEYS})

    def role_resources(self, role: str) -> RoleResources:
        """The resources of one role's tasks: ``slurm.resources.<role>`` over the shared ``slurm.*`` keys."""
        base = self.base_resources()
        own = self.resources.get(role)
        return base if own is None else own.over(base)


@dataclass(frozen=True)
class RefitSpec:
    """How refits run at this site."""

    transport: str = "reshard"  # "reshard" | "gather_broadcast" | "hybrid"
    latency_budget_s: float = 30.0
    bucket_mb: float = 256.0
    timeout_s: float = 300.0
    rendezvous_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        p = []
        if self.transport not in TRANSPORTS:
            p.append(f"refit.transport must be one of {', '.join(TRANSPORTS)}; got {self.transport!r}")
        for k in ("latency_budget_s", "timeout_s", "rendezvous_timeout_s"):
            if not getattr(self, k) > 0:
                p.append(f"refit.{k} must be > 0, got {getattr(self, k)!r}")
        bucket = bucket_mb_problem(self.bucket_mb)
        if bucket:
            p.append(f"refit.bucket_mb {bucket}")
        _raise(p, "invalid RefitSpec")

    @property
    def bucket_bytes(self) -> int:
        """Bucket size in bytes (``bucket_mb`` is MiB, 2**20 bytes)."""
        return int(self.bucket_mb * MIB)


@dataclass(frozen=True)
class NcclSpec:
    """Caps on NCCL's own device memory, as this site sets them (its ``NCCL_*`` variables); used by the
    memory check's estimate of NCCL's buffers per GPU (launch/memory_check.py ``nccl_bytes``)."""

    buffsize_mb: float = 4.0  # NCCL_BUFFSIZE (NCCL's default: 4 MiB)
    max_channels: int = 32  # NCCL_MAX_NCHANNELS: channels of a communicator's rings/trees
    p2p_channels_per_peer: int = 2  # NCCL_NCHANNELS_PER_NET_PEER: channels per connected p2p direction

    def __post_init__(self) -> None:
        p = []
        if not 0 < self.buffsize_mb <= 1024:
            p.append(f"nccl.buffsize_mb must be > 0 and <= 1024, got {self.buffsize_mb!r}")
        for k in ("max_channels", "p2p_channels_per_peer"):
            if not 1 <= getattr(self, k) <= 64:
                p.append(f"nccl.{k} must be between 1 and 64, got {getattr(self, k)!r}")
        _raise(p, "invalid NcclSpec")

    @property
    def buffsize_bytes(self) -> int:
        return int(self.buffsize_mb * MIB)


@dataclass(frozen=True)
class SiteProfile:
    """One site: its nodes, GPUs, NVLink domains, links, Slurm settings and refit settings.

    ``source`` (a file path or ``builtin:<name>``) is provenance, not content: it takes no part in
    ``==`` or ``hash``, so the same profile read from YAML and from TOML compares equal.
    """

    name: str
    source: str = field(compare=False)
    nodes: tuple[str, ...]
    gpus_per_node: int
    nvlink_domain_nodes: int
    links: LinkSpec
    cpu_only: bool = False
    launcher: str = "local"  # how `reshardctl run` starts ranks by default: "local" | "slurm"
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    refit: RefitSpec = field(default_factory=RefitSpec)
    nccl: NcclSpec = field(default_factory=NcclSpec)
    measured: str | None = None  # a calibration file (``reshardctl calibrate --out``), as written in the profile
    state_dir: str | None = None  # where the site's ledger lives (None: the per-user state directory)
    gpu_memory_gib: float | None = None  # memory per GPU (GiB): `plan` checks the refit's per-GPU memory against it

    def __post_init__(self) -> None:
        _freeze(self, "nodes", tuple(self.nodes))
        p = []
        if not self.name:
            p.append("site name is empty")
        if not self.nodes:
            p.append("nodes is empty")
        dups = sorted(n for n, k in Counter(self.nodes).items() if k > 1)
        if dups:
            p.append(f"nodes lists {', '.join(dups[:5])}{' ...' if len(dups) > 5 else ''} more than once")
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            p.append(f"gpus_per_node must be between 1 and {MAX_GPUS_PER_NODE}, got {self.gpus_per_node!r}")
        if self.launcher not in LAUNCHERS:
            p.append(f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        if self.gpu_memory_gib is not None and not 0 < self.gpu_memory_gib <= 65536:
            p.append(f"gpu_memory_gib must be > 0 and <= 65536, got {self.gpu_memory_gib!r}")
        if not self.nvlink_domain_nodes >= 1:
            p.append(f"nvlink_domain_nodes must be >= 1, got {self.nvlink_domain_nodes!r}")
        elif self.nodes and len(self.nodes) % self.nvlink_domain_nodes:
            p.append(domain_message(len(self.nodes), self.nvlink_domain_nodes))
        _raise(p, f"invalid site profile {self.source}")

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory_gib is None else int(self.gpu_memory_gib * (1 << 30))

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def gpus_per_domain(self) -> int:
        return self.nvlink_domain_nodes * self.gpus_per_node

    @property
    def num_domains(self) -> int:
        return self.num_nodes // self.nvlink_domain_nodes


def domain_message(n: int, d: int) -> str:
    """The arithmetic of a partial NVLink domain, with the nearest whole sizes."""
    lo, hi = (n // d) * d, (n // d + 1) * d
    fits = f"{lo} or {hi}" if lo else f"{hi}"
    return (
        f"nodes ({n}) is not a multiple of nvlink_domain_nodes ({d}): {n} = {n // d} x {d} + {n % d}; "
        f"list whole NVLink domains ({fits} nodes) or fix nvlink_domain_nodes"
    )


def profile_to_dict(p: SiteProfile) -> dict:
    """The resolved profile as plain JSON-able data (defaults filled in, nodes expanded).

    Keys are the profile file's own keys plus ``source``; without ``source`` the dict is itself a
    valid profile that parses back to an equal ``SiteProfile``. For fingerprints, drop ``source``.
    """
    s, l, r = p.slurm, p.links, p.refit
    return {
        "site": p.name,
        "source": p.source,
        "nodes": list(p.nodes),
        "gpus_per_node": p.gpus_per_node,
        "nvlink_domain_nodes": p.nvlink_domain_nodes,
        "cpu_only": p.cpu_only,
        "launcher": p.launcher,
        "links": {
            "nvlink_gbytes_per_s": l.nvlink_gbytes_per_s,
            "nic_gbits_per_s": l.nic_gbits_per_s,
            "nics_per_node": l.nics_per_node,
            "nvlink_latency_us": l.nvlink_latency_us,
            "nic_latency_us": l.nic_latency_us,
            "nvlink_efficiency": l.nvlink_efficiency,
            "nic_efficiency": l.nic_efficiency,
            "launch_us": l.launch_us,
            "mem_gbytes_per_s": l.mem_gbytes_per_s,
            "checksum_gbytes_per_s": l.checksum_gbytes_per_s,
            "landing_us_per_param": l.landing_us_per_param,
            "loader_us_per_tensor": l.loader_us_per_tensor,
        },
        "measured": p.measured,
        "slurm": {
            "partitions": dict(s.partitions),
            "account": s.account,
            "qos": s.qos,
            "time_min": s.time_min,
            "constraint": s.constraint,
            "gpus_per_node": s.gpus_per_node,
            "container_image": s.container_image,
            "container_mounts": list(s.container_mounts),
            "modules": list(s.modules),
            "env": dict(s.env),
            "extra_sbatch": list(s.extra_sbatch),
            "setup": list(s.setup),
            "mode": s.mode,
            "python": s.python,
            "port_min": s.port_min,
            "port_max": s.port_max,
            "peer_wait_s": s.peer_wait_s,
            "extra_srun": list(s.extra_srun),
            "cpus_per_task": s.cpus_per_task,
            "mem": s.mem,
            "mem_per_cpu": s.mem_per_cpu,
            "gpus_per_task": s.gpus_per_task,
            "gpu_bind": s.gpu_bind,
            "resources": {r: v.as_dict() for r, v in s.resources.items()},
            "signal": s.signal,
            "requeue": s.requeue,
            "container_expand": s.container_expand,
        },
        "refit": {
            "transport": r.transport,
            "latency_budget_s": r.latency_budget_s,
            "bucket_mb": r.bucket_mb,
            "timeout_s": r.timeout_s,
            "rendezvous_timeout_s": r.rendezvous_timeout_s,
        },
        "nccl": {
            "buffsize_mb": p.nccl.buffsize_mb,
            "max_channels": p.nccl.max_channels,
            "p2p_channels_per_peer": p.nccl.p2p_channels_per_peer,
        },
        "state_dir": p.state_dir,
        "gpu_memory_gib": p.gpu_memory_gib,
    }
