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
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from reshardctl.errors import ProfileError

FORMAT = "reshardctl-calibration/1"
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
        if not named.is_file():
            raise ProfileError(f"site profile {site.source}: measured: {site.measured}: no such file ({named})",
                               hint=f"run `reshardctl calibrate --site {site.name} --out {named}`")
        return read_measured(named, site.name)
    p = default_path(site.name)
    return read_measured(p, site.name) if p.is_file() else None


def _num(data: dict, key: str, where: str, problems: list[str], *, positive: bool = True) -> float:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        problems.append(f"{where}{key}: expected a finite number{' > 0' if positive else ''}, got {v!r}")
        return float("nan")
    return float(v)


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
        _dt.datetime.fromisoformat(str(date).replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"date: expected an ISO 8601 time such as 2026-01-31T12:00:00Z, got {date!r}")
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        problems.append(f"hosts: expected a list of host names, got {hosts!r}")
        hosts = []
    versions = data.get("versions")
    if not isinstance(versions, dict):
        problems.append(f"versions: expected a mapping, got {versions!r}")
        versions = {}
    ranks = _num(data, "ranks", "", problems)
    cores = _num(data, "cores", "", problems)
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
                    ranks=int(ranks), cores=int(cores), figures=figures, samples=dict(data.get("samples") or {}))


def read_measured(path: str | Path, site_name: str | None = None) -> Measured:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"cannot read calibration file {p}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"calibration file {p}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    return parse_measured(data, str(p), site_name)


def human_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
