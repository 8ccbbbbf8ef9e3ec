"""Reading YAML, TOML and JSON inputs with bounds on size, depth and magnitude, checked before anything
is built (site profiles, model configs, safetensors indexes and headers, layout files all read here).

* ``read_bytes``: only a regular file (a FIFO, a device such as ``/dev/zero`` or a directory is refused
  without reading it; a FIFO is opened non-blocking, so it never hangs), at most ``max_bytes``.
* Nesting deeper than ``MAX_DEPTH`` lists/mappings is refused (the parsers recurse; Python would raise
  ``RecursionError`` near 1,000 levels).
* A number literal longer than ``MAX_NUMBER_CHARS`` characters is refused before Python's ``int()``
  sees it (which refuses more than 4,300 digits with a ``ValueError``, and is slow before that).
* YAML: at most ``max_nodes`` nodes after alias expansion (a 400-byte "billion laughs" alias bomb is
  refused while it is being read, not after), no alias to an anchor that is still open (a recursive
  structure), mapping keys must be plain scalars (``? [a, b]`` is refused), duplicate keys are refused.

Every refusal is a ``LoadError`` whose message says what and the limit; callers prefix the file and
turn it into their own ``InputError`` (``ProfileError``, ``ModelError``, ``LayoutError``).
Limits: docs/site-profiles.md and docs/models.md ("Input limits").
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_DEPTH = 64
MAX_NUMBER_CHARS = 64
MIB = 1 << 20


class LoadError(ValueError):
    """An input refused by a bound or by its parser; ``str()`` is the reason (without the file name).
    ``reading``: the file itself could not be read (missing, not a regular file, too big, not UTF-8);
    ``missing``: it does not exist."""

    def __init__(self, message: str, *, reading: bool = False, missing: bool = False):
        super().__init__(message)
        self.reading = reading
        self.missing = missing


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(fd: int) -> os.stat_result:
    """``fstat`` of an open descriptor when it is a regular file; ``LoadError`` naming what it is otherwise."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        raise LoadError(f"is {kind}, not a file" if kind.startswith("a ") else "is not a regular file", reading=True)
    return st


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of ``path`` (opened with ``flags``, read-only by default; ``mode`` when ``O_CREAT`` creates it) when it is a regular file
    (symlinks followed); ``LoadError`` for anything else, decided without reading (a FIFO is opened
    non-blocking, so this never hangs). ``FileNotFoundError`` is a ``LoadError`` with ``missing`` set."""
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), mode)
    except FileNotFoundError:
        raise LoadError("no such file", reading=True, missing=True) from None
    except PermissionError:
        raise LoadError("permission denied", reading=True) from None
    except OSError as exc:
        raise LoadError(f"cannot open: {exc.strerror or exc}", reading=True) from None
    try:
        check_regular(fd)
    except LoadError:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, max_bytes: int) -> bytes:
    """The bytes of an open regular file (from its current offset), at most ``max_bytes``."""
    try:
        st = check_regular(fd)
        if st.st_size > max_bytes:
            raise LoadError(f"is {st.st_size:,} bytes, more than the limit of {max_bytes:,} bytes", reading=True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # grew while being read
                raise LoadError(f"is more than the limit of {max_bytes:,} bytes", reading=True)
        return b"".join(chunks)
    except OSError as exc:
        raise LoadError(f"cannot read: {exc.strerror or exc}", reading=True) from None


def read_bytes(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ``LoadError`` otherwise (never blocks)."""
    fd = open_regular(path)
    try:
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, max_bytes: int) -> str:
    """``read_bytes`` decoded as UTF-8."""
    return decode(read_bytes(path, max_bytes))


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LoadError(f"not UTF-8 text (byte {exc.start})", reading=True) from None


# --- JSON and TOML: one pass over the tokens that matter (strings skipped), before parsing ------------
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]|[0-9][0-9_.eE+-]*', re.S)
_TOML_TOKENS = re.compile(
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[{]|[\]}]'
    r'|[0-9][0-9_.eE+:TZ-]*', re.S)


def _scan(text: str, tokens: re.Pattern) -> None:
    depth = 0
    for m in tokens.finditer(text):
        tok = m.group()
        c = tok[0]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, m.start()) + 1
                raise LoadError(f"nested more than {MAX_DEPTH} lists/mappings deep (line {line}; limit MAX_DEPTH)")
        elif c in "]}":
            depth -= 1
        elif c.isdigit() and len(tok) > MAX_NUMBER_CHARS:
            line = text.count("\n", 0, m.start()) + 1
            raise LoadError(f"a number of {len(tok):,} characters (line {line}; the limit is "
                            f"{MAX_NUMBER_CHARS}, MAX_NUMBER_CHARS): {tok[:20]}...")


def loads_json(text: str | bytes) -> Any:
    """JSON with the depth and number bounds; ``LoadError`` for syntax errors too."""
    if isinstance(text, bytes):
        text = decode(text)
    _scan(text, _JSON_TOKENS)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LoadError(f"not valid JSON: {exc}") from None


def loads_toml(text: str) -> Any:
    _scan(text, _TOML_TOKENS)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LoadError(f"TOML syntax error: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise LoadError(f"TOML value refused: {exc}") from None


# --- YAML: bounds enforced while composing, so nothing is built past a limit ------------------------
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


def _at(mark) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _BoundedLoader(yaml.SafeLoader):
    max_nodes = 100_000

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._count = 0
        self._sizes: dict[str, int] = {}  # closed anchor -> its node count, aliases expanded

    def _add(self, n: int, mark) -> None:
        self._count += n
        if self._count > self.max_nodes:
            raise LoadError(f"more than {self.max_nodes:,} values{_at(mark)} (aliases count once per use; "
                            "the limit bounds alias bombs)")

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            size = self._sizes.get(event.anchor)
            if size is None and event.anchor in self.anchors:
                raise LoadError(f"alias *{event.anchor}{_at(event.start_mark)} refers to a value that contains it")
            if size is not None:
                self._add(size, event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise LoadError(f"nested more than {MAX_DEPTH} lists/mappings deep{_at(event.start_mark)} (limit MAX_DEPTH)")
        start = self._count
        self._add(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.ScalarNode) and node.tag in (_INT_TAG, _FLOAT_TAG) \
                and len(node.value) > MAX_NUMBER_CHARS:
            raise LoadError(f"a number of {len(node.value):,} characters{_at(node.start_mark)} (the limit is "
                            f"{MAX_NUMBER_CHARS}, MAX_NUMBER_CHARS): {node.value[:20]}...")
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                    raise LoadError(f"a key{_at(key_node.start_mark)} is {kind}; keys must be plain names")
        if getattr(event, "anchor", None):
            self._sizes[event.anchor] = self._count - start
        return node


def _construct_mapping(loader: _BoundedLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:  # keys are scalars (checked while composing)
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            raise LoadError(f"duplicate key {str(key)[:80]!r}{_at(key_node.start_mark)}")
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _prescan(text: str, max_nodes: int) -> None:
    """The same depth and value-count bounds over libyaml's event stream (C, fast), before the Python
    composer runs: PyYAML's own scanner looks up to 1,024 characters ahead for a possible simple key
    and spends quadratic time on deep flow nesting (0.5 s for ``[[[[...``) before the composer's check
    can fire. Syntax errors are left to the Python pass, which words them."""
    depth = count = 0
    sizes: dict[str, int] = {}
    open_: list[tuple[str | None, int]] = []
    try:
        for ev in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(ev, yaml.AliasEvent):
                if ev.anchor not in sizes:
                    if any(a == ev.anchor for a, _ in open_):
                        raise LoadError(f"alias *{ev.anchor}{_at(ev.start_mark)} refers to a value that contains it")
                    return  # an undefined alias: the Python pass reports it
                count += sizes[ev.anchor]
            elif isinstance(ev, yaml.ScalarEvent):
                count += 1
                if ev.anchor:
                    sizes[ev.anchor] = 1
            elif isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                count += 1
                depth += 1
                if depth > MAX_DEPTH:
                    raise LoadError(f"nested more than {MAX_DEPTH} lists/mappings deep{_at(ev.start_mark)} "
                                    "(limit MAX_DEPTH)")
                open_.append((ev.anchor, count - 1))
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
                anchor, start = open_.pop()
                if anchor:
                    sizes[anchor] = count - start
            if count > max_nodes:
                raise LoadError(f"more than {max_nodes:,} values{_at(ev.start_mark)} (aliases count once per use; "
                                "the limit bounds alias bombs)")
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit (1,000 levels), hit while looking ahead
            mark = getattr(exc, "problem_mark", None)
            raise LoadError(f"nested more than {MAX_DEPTH} lists/mappings deep{_at(mark)} (limit MAX_DEPTH)") from None
        return  # a syntax error: the Python pass words it


def loads_yaml(text: str, *, max_nodes: int = 100_000) -> Any:
    """YAML (the safe subset) with the depth, number, node-count and key bounds."""
    if getattr(yaml, "__with_libyaml__", False):
        _prescan(text, max_nodes)
    loader_cls = type("_Loader", (_BoundedLoader,), {"max_nodes": max_nodes})
    loader = None
    try:
        loader = loader_cls(text)  # the reader refuses control characters here already
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise LoadError(f"YAML syntax error{_at(mark)}: {what}") from None
    except yaml.YAMLError as exc:
        raise LoadError(f"YAML syntax error: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, LoadError):
            raise
        raise LoadError(f"YAML value refused: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_file(path: str | os.PathLike, fmt: str, *, max_bytes: int, max_nodes: int = 100_000) -> Any:
    """Read ``path`` (``read_bytes``) and parse it as ``fmt`` (``yaml`` | ``toml`` | ``json``)."""
    text = decode(read_bytes(path, max_bytes))
    if fmt == "json":
        return loads_json(text)
    if fmt == "toml":
        return loads_toml(text)
    return loads_yaml(text, max_nodes=max_nodes)


__all__ = ["LoadError", "MAX_DEPTH", "MAX_NUMBER_CHARS", "check_regular", "decode", "load_file", "loads_json",
           "loads_toml", "loads_yaml", "open_regular", "read_bytes", "read_fd", "read_text"]
