"""Calibration files: what `reshardctl calibrate` measured on a site's machines, read back for the cost model.

Where a site's calibration lives (first found wins):

1. the profile's ``measured: FILE`` key (relative to the profile file's directory), a shared file;
2. the per-user state directory: ``$XDG_STATE_HOME/reshardctl/<site>.calibration.json``
   (``~/.local/state/reshardctl/`` when ``XDG_STATE_HOME`` is unset), where `calibrate` writes by default.

The file is JSON (``FORMAT``); every figure is checked on reading, and a bad file is a ``ProfileError``
naming the file and the key. Without a file the cost model uses the profile's datasheet figures.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import ProfileError

FORMAT = "reshardctl-calibration/1"
MAX_RANKS = 1 << 20  # ranks of a calibration world (layout_file.MAX_WORLD)
MAX_CORES = 1 << 20  # CPU cores of one calibration host
MAX_CALIBRATION_BYTES = 64 << 20
# figures the cost model reads (all > 0); units in the names
FIGURES = (
    "intra_node_bytes_per_s", "intra_node_latency_s",
    "cross_node_bytes_per_s", "cross_node_latency_s",
    "node_aggregate_bytes_per_s", "launch_s", "per_message_s",
    "broadcast_bytes_per_s", "copy_bytes_per_s", "checksum_bytes_per_s",
    "copy_side_bytes_per_s", "checksum_side_bytes_per_s",
)
# figures a calibration may lack (files written before they were measured): the model falls back
OPTIONAL_FIGURES = (
    "checksum_world_bytes_per_s",  # every rank of the calibration at once (both sides of a refit)
    "control_round_s",  # one control-plane all-reduce of every rank (a refit's vote, its acknowledgement)
    "landing_s_per_param",  # host time per parameter segment landed directly (one _foreach_copy_ of all)
    "loader_s_per_tensor",  # host time per HF tensor through a framework loader call (calibrate/landing.py)
    "mapping_s_per_entry",  # host time per entry of a load_weights name-mapping scan (plan/engine_cost.py)
    "named_params_s_per_param",  # host time per parameter of dict(model.named_parameters()) (plan/engine_cost.py)
)


@dataclass(frozen=True)
class Measured:
    """One calibration: the figures (``FIGURES``), and where, when and with what they were measured."""

    path: str
    site: str
    date: str  # ISO 8601, UTC
    hosts: tuple[str, ...]
    versions: dict
    ranks: int
    cores: int
    figures: dict  # name -> float (FIGURES)
    samples: dict = field(default_factory=dict, compare=False)  # the raw microbenchmark points

    def age_s(self, now: _dt.datetime | None = None) -> float:
        when = _dt.datetime.fromisoformat(self.date.replace("Z", "+00:00"))
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return (now - when).total_seconds()


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "reshardctl"


def default_path(site_name: str) -> Path:
    return state_dir() / f"{site_name}.calibration.json"


def profile_measured_path(site) -> Path | None:
    """The file named by the profile's ``measured:`` key, resolved against the profile's directory."""
    if not site.measured:
        return None
    p = Path(site.measured).expanduser()
    if not p.is_absolute() and not site.source.startswith("builtin:"):
        p = Path(site.source).parent / p
    return p


def find_measured(site) -> Measured | None:
    """The site's calibration, or None (datasheet figures). A ``measured:`` key naming a missing file is
    an error (the site said where its figures are); a missing default file is not."""
    named = profile_measured_path(site)
    if named is not None:
        if not named.exists():
            raise ProfileError(f"site profile {site.source}: measured: {site.measured}: no such file ({named})",
                               hint=f"run `reshardctl calibrate --site {site.name} --out {named}`")
        return read_measured(named, site.name)
    p = default_path(site.name)
    return read_measured(p, site.name) if p.exists() else None


def _num(data: dict, key: str, where: str, problems: list[str], *, positive: bool = True) -> float:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        problems.append(f"{where}{key}: expected a finite number{' > 0' if positive else ''}, got {v!r}")
        return float("nan")
    return float(v)


def _count(data: dict, key: str, high: int, problems: list[str]) -> int:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high:
        problems.append(f"{key}: expected an integer from 1 to {high:,}, got {str(v)[:40]}")
        return 0
    return v


def parse_measured(data, path: str, site_name: str | None = None) -> Measured:
    """Validate a calibration mapping; one ``ProfileError`` listing every problem, naming file and key."""
    if not isinstance(data, dict):
        raise ProfileError(f"calibration file {path}: expected a JSON object, got {type(data).__name__}")
    problems: list[str] = []
    if data.get("format") != FORMAT:
        problems.append(f"format: expected {FORMAT!r}, got {data.get('format')!r}")
    site = data.get("site")
    if not isinstance(site, str) or not site:
        problems.append(f"site: expected a site name, got {site!r}")
    elif site_name is not None and site != site_name:
        problems.append(f"site: the file was measured for site {site!r}, not {site_name!r}")
    date = data.get("date")
    try:
        when = _dt.datetime.fromisoformat(str(date).replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"date: expected an ISO 8601 time such as 2026-01-31T12:00:00Z, got {date!r}")
    else:
        if when.tzinfo is None:  # its age could not be computed (local time of which zone?)
            problems.append(f"date: {date!r} has no time zone; expected UTC such as 2026-01-31T12:00:00Z")
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        problems.append(f"hosts: expected a list of host names, got {hosts!r}")
        hosts = []
    versions = data.get("versions")
    if not isinstance(versions, dict):
        problems.append(f"versions: expected a mapping, got {versions!r}")
        versions = {}
    ranks = _count(data, "ranks", MAX_RANKS, problems)
    cores = _count(data, "cores", MAX_CORES, problems)
    samples = data.get("samples", {})
    if samples is None:
        samples = {}
    if not isinstance(samples, dict):
        problems.append(f"samples: expected a mapping of microbenchmark points, got {type(samples).__name__}")
        samples = {}
    figs_raw = data.get("figures")
    figures: dict[str, float] = {}
    if not isinstance(figs_raw, dict):
        problems.append(f"figures: expected a mapping of {', '.join(FIGURES)}, got {figs_raw!r}")
    else:
        for k in FIGURES:
            figures[k] = _num(figs_raw, k, "figures.", problems)
        for k in OPTIONAL_FIGURES:
            if k in figs_raw:
                figures[k] = _num(figs_raw, k, "figures.", problems)
        unknown = sorted(set(figs_raw) - set(FIGURES) - set(OPTIONAL_FIGURES))
        if unknown:
            problems.append(f"figures: unknown keys {unknown}")
    if problems:
        msg = problems[0] if len(problems) == 1 else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        raise ProfileError(f"calibration file {path}: {msg}", hint="run `reshardctl calibrate` again to rewrite it")
    return Measured(path=str(path), site=site, date=str(date), hosts=tuple(hosts), versions=dict(versions),
                    ranks=ranks, cores=cores, figures=figures, samples=dict(samples))


def read_measured(path: str | Path, site_name: str | None = None) -> Measured:
    p = Path(path)
    try:
        text = read_text(p, MAX_CALIBRATION_BYTES)
    except LoadError as exc:
        raise ProfileError(f"cannot read calibration file {p}: {exc}") from None
    try:
        data = loads_json(text)
    except LoadError as exc:
        raise ProfileError(f"calibration file {p}: {exc}") from None
    return parse_measured(data, str(p), site_name)


def human_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
