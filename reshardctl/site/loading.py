"""Finding and reading profile files: by path, by name (RESHARDCTL_PROFILE_PATH, then shipped profiles)."""

from __future__ import annotations

import difflib
import os
from importlib import resources
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, load_file
from reshardctl.errors import ProfileError
from reshardctl.site.parse import parse_profile
from reshardctl.site.spec import SiteProfile

DEFAULT_PROFILE = "local"
ENV_PATH = "RESHARDCTL_PROFILE_PATH"
SUFFIXES = (".yaml", ".yml", ".toml")


def shipped_dir() -> Path:
    """The directory of the profiles that ship with reshardctl (package data, or the repo checkout)."""
    packaged = Path(str(resources.files("reshardctl"))) / "data" / "site_profiles"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "site_profiles"  # checkout without the symlink


def search_dirs() -> list[tuple[Path, str]]:
    """(directory, kind) in search order: RESHARDCTL_PROFILE_PATH entries ("path"), then shipped ("builtin")."""
    dirs = [(Path(p).expanduser(), "path") for p in os.environ.get(ENV_PATH, "").split(os.pathsep) if p.strip()]
    dirs.append((shipped_dir(), "builtin"))
    return dirs


def available_profiles() -> list[tuple[str, str, Path]]:
    """Every profile findable by name: (name, source, file), first match wins, sorted by name."""
    seen: dict[str, tuple[str, str, Path]] = {}
    for d, kind in search_dirs():
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.suffix in SUFFIXES and f.is_file() and f.stem not in seen:
                seen[f.stem] = (f.stem, f"builtin:{f.stem}" if kind == "builtin" else str(f), f)
    return [seen[k] for k in sorted(seen)]


def _find_by_name(name: str) -> tuple[Path, str]:
    for d, kind in search_dirs():
        for suffix in SUFFIXES:
            f = d / f"{name}{suffix}"
            if f.is_file():
                return f, (f"builtin:{name}" if kind == "builtin" else str(f))
    names = [n for n, _, _ in available_profiles()]
    match = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {match[0]!r}? " if match else ""
    raise ProfileError(
        f"no site profile named {name!r} (and no such file)",
        hint=f"{hint}Known profiles: {', '.join(names) or 'none'}. Give a path to a .yaml/.yml/.toml file, "
        f"or add a directory to {ENV_PATH}.",
    )


MAX_PROFILE_BYTES = 1 << 20  # 1 MiB: the largest shipped profile is under 2 KiB
MAX_PROFILE_VALUES = 100_000  # YAML values after alias expansion


def _read(path: Path, label: str) -> Any:
    """Read and parse one file within the bounds of ``reshardctl.bounded_load``; every failure becomes
    a ProfileError naming the file."""
    if path.suffix.lower() not in SUFFIXES:
        if path.is_dir():
            raise ProfileError(f"cannot read site profile {label}: it is a directory, not a file")
        if not path.exists():
            raise ProfileError(f"cannot read site profile {label}: no such file")
        raise ProfileError(f"site profile {label}: unknown file type {path.suffix!r} (use .yaml, .yml or .toml)")
    fmt = "toml" if path.suffix.lower() == ".toml" else "yaml"
    try:
        data = load_file(path, fmt, max_bytes=MAX_PROFILE_BYTES, max_nodes=MAX_PROFILE_VALUES)
    except LoadError as exc:
        verb = "cannot read site profile" if exc.reading else "site profile"
        raise ProfileError(f"{verb} {label}: {exc}") from None
    if data is None:
        raise ProfileError(f"site profile {label}: the file is empty")
    return data


def load_profile_file(path: str | os.PathLike, source: str | None = None) -> SiteProfile:
    """Read, parse and validate one profile file."""
    p = Path(path)
    label = source or str(path)
    return parse_profile(_read(p, label if source is None else f"{source} ({p})"), label)


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(SUFFIXES) or os.sep in spec or (os.altsep or "/") in spec or Path(spec).is_file()


def load_profile(spec: str | os.PathLike | None) -> SiteProfile:
    """Load a site profile.

    ``spec``: ``None`` -> the shipped ``local`` profile; a path (anything ending in .yaml/.yml/.toml,
    containing a path separator, or naming an existing file) -> that file; otherwise a profile name,
    looked up in the directories of ``RESHARDCTL_PROFILE_PATH`` (colon-separated), then among the
    shipped profiles.
    """
    if spec is None:
        spec = DEFAULT_PROFILE
    if isinstance(spec, os.PathLike) or _looks_like_path(str(spec)):
        return load_profile_file(os.fspath(spec))
    name = str(spec).strip()
    path, source = _find_by_name(name)
    return load_profile_file(path, source)
