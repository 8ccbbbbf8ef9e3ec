"""A framework's configuration as one merged tree, with the file (and line) each value came from.

Two ways a tree is built, as the frameworks build theirs:

* ``load_with_defaults(path)``: NeMo RL's ``load_config_with_inheritance`` (``nemo_rl/utils/config.py``,
  NVIDIA-NeMo/RL 7ea279ab): a YAML mapping whose ``defaults:`` key (one path or a list of paths, relative
  to the file's directory, absolute allowed) names parents; each parent is loaded the same way (its own
  ``defaults`` relative to its own directory), the parents are merged in order (a later one wins), then the
  file itself over them. Merging (OmegaConf's): mappings recursively, anything else (scalars, lists)
  replaced whole; a child mapping with ``_override_: true`` replaces the parent's mapping instead of
  merging into it (at the top level, where NeMo RL looks for the marker); a child value ``???`` (mandatory,
  not given) leaves the parent's value.
* ``apply_overrides(tree, items)``: Hydra's command-line overrides (``key=value``, ``+key=value`` adds,
  ``++key=value`` adds or sets, ``~key`` deletes), as a verl launch script passes them.

Every file is read through ``bounded_load`` (size, depth, alias and number bounds); a ``defaults`` cycle,
a missing parent, more than ``MAX_FILES`` files or a chain deeper than ``MAX_CHAIN`` is an ``InputError``
naming the file and the chain. ``resolve`` reads one value and resolves its OmegaConf interpolations
(``${a.b.c}``, NeMo RL's ``${mul:x,y}`` / ``${add:x,y}``); any other interpolation is refused by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from reshardctl.bounded_load import LoadError, load_file, loads_yaml
from reshardctl.errors import InputError

MAX_BYTES = 4 << 20  # one config file
MAX_FILES = 64  # files in one defaults tree
MAX_CHAIN = 16  # defaults nested this deep
MISSING = "???"

Path_ = tuple[str, ...]


@dataclass
class ConfigTree:
    """The merged mapping and, per leaf (a scalar, a list or an empty mapping), where it was set."""

    data: dict
    origin: dict[Path_, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def has(self, path: str) -> bool:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def raw(self, path: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def where(self, path: str) -> str:
        """The file (or script line) that set ``path``'s value."""
        key = tuple(path.split("."))
        if key in self.origin:
            return self.origin[key]
        under = [o for p, o in self.origin.items() if p[:len(key)] == key]
        return under[-1] if under else "?"

    def leaves(self) -> Iterator[tuple[str, Any]]:
        """(dotted path, value) of every leaf: a scalar, a list or an empty mapping."""
        for key, value in self.data.items():
            yield from _leaves(value, (str(key),))

    def resolve(self, path: str, default: Any = None) -> Any:
        """``path``'s value with its interpolations resolved (``InputError`` naming the key when one
        cannot be)."""
        return _resolve(self, path, self.raw(path, default), depth=0)


def _leaves(node: Any, prefix: Path_) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, prefix + (str(k),))
    else:
        yield ".".join(prefix), node


def _origins(node: Any, prefix: Path_, label: str) -> dict[Path_, str]:
    if isinstance(node, dict) and (node or not prefix):
        out: dict[Path_, str] = {}
        for k, v in node.items():
            out.update(_origins(v, prefix + (str(k),), label))
        return out
    return {prefix: label}


def tree_of(data: dict, label: str) -> ConfigTree:
    """One file's mapping as a tree, every leaf set by ``label``."""
    return ConfigTree(data, _origins(data, (), label), [label])


def merge(base: ConfigTree, over: ConfigTree) -> ConfigTree:
    """``over`` merged into ``base`` (neither changed), NeMo RL's ``merge_with_override``: a top-level
    mapping of ``over`` holding ``_override_: true`` replaces ``base``'s (the marker removed; NeMo RL
    looks for it at the top level only), ``???`` values of ``over`` are skipped, the rest is OmegaConf's
    merge."""
    origin = dict(base.origin)
    data = _copy(base.data)
    top = {}
    for key, value in over.data.items():
        if isinstance(value, dict) and value.get("_override_", False) is True:
            value = {k: v for k, v in value.items() if k != "_override_"}
            data.pop(key, None)
            _drop(origin, (str(key),))
        top[key] = value
    data = _merge(data, top, (), origin, over.origin)
    return ConfigTree(data, origin, base.files + [f for f in over.files if f not in base.files])


def _drop(origin: dict[Path_, str], prefix: Path_) -> None:
    for p in [p for p in origin if p[:len(prefix)] == prefix]:
        del origin[p]


def _merge(base: dict, over: dict, prefix: Path_, origin: dict, over_origin: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        here = prefix + (str(key),)
        if value == MISSING:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, here, origin, over_origin)
            if not out[key]:  # an empty mapping is a leaf
                origin[here] = over_origin.get(here, origin.get(here, "?"))
            continue
        _drop(origin, here)
        out[key] = _copy(value)
        origin.update({p: o for p, o in over_origin.items() if p[:len(here)] == here})
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def read_mapping(path: Path, label: str) -> dict:
    """One YAML file, which must be a mapping (``InputError`` naming it otherwise)."""
    try:
        data = load_file(path, "yaml", max_bytes=MAX_BYTES)
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{label}: is a directory, not a config file") from None
    except LoadError as e:
        raise InputError(f"{label}: {e}") from None
    except OSError as e:
        raise InputError(f"{label}: cannot read it ({e.strerror or e})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{label}: the top level must be a mapping, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise InputError(f"{label}: top-level keys must be strings, got {bad[0]!r}")
    return data


def load_with_defaults(path: str | os.PathLike) -> ConfigTree:
    """``path`` and its ``defaults`` parents merged as NeMo RL merges them."""
    counter = [0]
    return _load(Path(path), (), counter)


def _label(path: Path) -> str:
    return path.name


def _load(path: Path, chain: tuple[Path, ...], counter: list[int]) -> ConfigTree:
    real = Path(os.path.realpath(path))
    label = str(path)
    if real in chain:
        names = " -> ".join(p.name for p in (*chain, real))
        raise InputError(f"{label}: `defaults` cycle: {names}",
                         hint="a config may not inherit from itself, directly or through its parents")
    if len(chain) >= MAX_CHAIN:
        raise InputError(f"{label}: `defaults` nested more than {MAX_CHAIN} files deep "
                         f"({' -> '.join(p.name for p in chain[:4])} -> ...)")
    counter[0] += 1
    if counter[0] > MAX_FILES:
        raise InputError(f"{label}: more than {MAX_FILES} files in one `defaults` tree")
    data = read_mapping(path, label)
    defaults = data.pop("defaults", None)
    if defaults is None:
        parents: list[str] = []
    elif isinstance(defaults, str):
        parents = [defaults]
    elif isinstance(defaults, list) and all(isinstance(d, str) for d in defaults):
        parents = list(defaults)
    else:
        raise InputError(f"{label}: `defaults` must be a path or a list of paths, got {defaults!r:.80}",
                         hint="NeMo RL's defaults are file paths relative to the config's directory")
    base = ConfigTree({})
    for parent in parents:
        ppath = Path(parent) if parent.startswith("/") else path.parent / parent
        if not ppath.exists():
            raise InputError(f"{label}: `defaults` names {parent!r}, which does not exist ({ppath})")
        base = merge(base, _load(ppath, (*chain, real), counter))
    marked = {k: ({kk: vv for kk, vv in v.items() if kk != "_override_"}
                  if isinstance(v, dict) and v.get("_override_", False) is True else v) for k, v in data.items()}
    mine = ConfigTree(data, _origins(marked, (), _label(path)), [str(path)])
    if not parents:  # NeMo RL merges only when there are defaults
        return mine
    return merge(base, mine)


# ------------------------------------------------------------------------------ Hydra overrides -------
_OVERRIDE_RE = re.compile(r"(~|\+\+|\+)?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_0-9][A-Za-z0-9_]*)*)(?:=(.*))?", re.S)


def parse_value(text: str) -> Any:
    """A Hydra override's value (YAML-like scalars and lists, as Hydra's grammar reads them)."""
    if text == "":
        return ""
    try:
        return loads_yaml(text, max_nodes=10_000)
    except LoadError:
        return text


def apply_overrides(tree: ConfigTree, items: list[tuple[str, str]]) -> ConfigTree:
    """``items``: (``key=value`` text, where it was given) in order; the later wins."""
    data = _copy(tree.data)
    origin = dict(tree.origin)
    for text, where in items:
        m = _OVERRIDE_RE.fullmatch(text)
        if not m or (m[1] != "~" and m[3] is None):
            raise InputError(f"{where}: {text[:80]!r} is not a Hydra override (key=value, +key=value, ~key)")
        op, key, raw = m[1] or "", m[2], m[3]
        parts = tuple(key.split("."))
        node = data
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        _drop(origin, parts)
        if op == "~":
            node.pop(parts[-1], None)
            continue
        value = parse_value(raw)
        node[parts[-1]] = value
        origin.update(_origins(value, parts, where))
    return ConfigTree(data, origin, list(tree.files))


# ------------------------------------------------------------------------------ interpolation ---------
_INTERP_RE = re.compile(r"\$\{([^${}]*)\}")
_FUNC_RE = re.compile(r"(mul|add):(.*)")


def _resolve(tree: ConfigTree, path: str, value: Any, depth: int) -> Any:
    if not isinstance(value, str) or "${" not in value:
        return value
    if depth > 16:
        raise InputError(f"{tree.where(path)}: `{path}`: interpolations nested more than 16 deep ({value[:60]!r})")
    text = value
    for _ in range(64):
        m = _INTERP_RE.search(text)
        if m is None:
            break
        inner = m[1].strip()
        f = _FUNC_RE.fullmatch(inner)
        if f:
            args = [a.strip() for a in f[2].split(",")]
            nums = [_resolve(tree, path, a, depth + 1) for a in args]
            nums = [_number(tree, path, a) for a in nums]
            out: Any = 1 if f[1] == "mul" else 0
            for n in nums:
                out = out * n if f[1] == "mul" else out + n
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", inner):
            if not tree.has(inner):
                raise InputError(f"{tree.where(path)}: `{path}` = {value[:80]!r}: `{inner}` is not in the config")
            out = _resolve(tree, inner, tree.raw(inner), depth + 1)
        else:
            raise InputError(f"{tree.where(path)}: `{path}` = {value[:80]!r}: interpolation `${{{inner}}}` "
                             "is not one reshardctl resolves (only ${a.b.c}, ${mul:..} and ${add:..})",
                             hint="write the value itself in the config")
        if m.start() == 0 and m.end() == len(text):
            return out
        text = text[:m.start()] + str(out) + text[m.end():]
    return text


def _number(tree: ConfigTree, path: str, value: Any) -> int | float:
    if isinstance(value, bool):
        raise InputError(f"{tree.where(path)}: `{path}`: {value!r} is not a number")
    if isinstance(value, (int, float)):
        return value
    try:
        return int(str(value))
    except ValueError:
        raise InputError(f"{tree.where(path)}: `{path}`: {value!r:.60} is not a number") from None


__all__ = ["ConfigTree", "MAX_BYTES", "MAX_CHAIN", "MAX_FILES", "apply_overrides", "load_with_defaults", "merge",
           "read_mapping", "tree_of"]
