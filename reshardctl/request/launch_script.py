"""A verl launch script's Hydra overrides: the ``python3 -m verl....`` command of a shell script as a
config tree, with the script's own variables expanded.

The command's backslash-continued lines are joined and split into shell words (``$((...))`` kept whole);
its ``--config-name`` is kept, its ``key=value`` / ``+key=value`` / ``++key=value`` / ``~key`` words are
applied in order (``config_tree.apply_overrides``, each leaf's origin ``script.sh:LINE``). ``$VAR``,
``${VAR}``, ``${VAR:-default}`` and ``$((integer arithmetic))`` are expanded from the script's own
assignments before the command, the environment taken as unset (``${VAR:-default}`` is the default). A
value that cannot be expanded (``$HOME``, an unset variable) stays in the tree as an ``Unresolved`` value
that says why, refused by name only where its key is read. A word without ``=`` (a variable holding
arguments) is expanded and split, or refused; ``$@`` is dropped; the arguments end at a redirection, a pipe
or ``;``. Bounded: the file by ``bounded_load.read_bytes``, the lines, the nesting of expansions.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from pathlib import Path

from reshardctl.bounded_load import LoadError, decode, read_bytes
from reshardctl.errors import InputError
from reshardctl.request.config_tree import MAX_BYTES, ConfigTree, apply_overrides

MAX_SCRIPT_LINES = 20_000


class Unresolved(str):
    """A value whose shell expansion failed; its text says which reference."""


# ----------------------------------------------------------------------------- shell expansion -------
_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.floordiv, ast.Mod: operator.mod}


class _NoValue(Exception):
    def __init__(self, ref: str):
        super().__init__(ref)
        self.ref = ref


def _arith(expr: str, env: dict[str, str]) -> str:
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise _NoValue(f"$(({expr}))") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            raw = env.get(node.id)
            if isinstance(raw, Unresolved) or raw is None or not re.fullmatch(r"-?[0-9]{1,18}", raw):
                raise _NoValue(f"${node.id} (in $(({expr})))")
            return int(raw)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            right = ev(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod)) and right == 0:
                raise _NoValue(f"$(({expr})) (division by zero)")
            out = _ARITH_OPS[type(node.op)](ev(node.left), right)
            if abs(out) > 1 << 62:
                raise _NoValue(f"$(({expr})) (too large)")
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise _NoValue(f"$(({expr}))")

    return str(ev(tree))


def _closing(text: str, i: int, open_: str, close: str) -> int:
    depth = 0
    while i < len(text):
        if text.startswith(open_, i):
            depth += 1
            i += len(open_)
            continue
        if text.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i
            i += len(close)
            continue
        i += 1
    raise _NoValue(text[:40])


def _known(name: str, env: dict[str, str]) -> str:
    value = env[name]
    if isinstance(value, Unresolved):
        raise _NoValue(f"${{{name}}} (set from {value})")
    return value


def expand(text: str, env: dict[str, str], depth: int = 0) -> str:
    """``text`` with ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``$((...))`` expanded from ``env``
    (``_NoValue`` naming the reference otherwise)."""
    if depth > 8:
        raise _NoValue(text[:40])
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if text.startswith("$((", i):
            end = _closing(text, i + 1, "(", ")")
            out.append(_arith(expand(text[i + 3:end - 1], env, depth + 1), env))
            i = end + 1
        elif text.startswith("${", i):
            end = _closing(text, i + 1, "{", "}")
            inner = text[i + 2:end]
            name, sep, default = inner.partition(":-")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise _NoValue("${" + inner[:40] + "}")
            if name in env:
                out.append(_known(name, env))
            elif sep:
                out.append(expand(default.strip('"').strip("'"), env, depth + 1))
            else:
                raise _NoValue("${" + name + "}")
            i = end + 1
        else:
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|@|\*|[0-9])", text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            if m[1] in ("@", "*") or m[1].isdigit():
                raise _NoValue("$" + m[1])
            if m[1] not in env:
                raise _NoValue("$" + m[1])
            out.append(_known(m[1], env))
            i += m.end()
    return "".join(out)


def _split(text: str) -> list[str]:
    """Shell words of ``text``, each ``$((...))`` kept whole (spaces inside arithmetic are not word breaks)."""
    table: list[str] = []
    out, i = [], 0
    while i < len(text):
        j = text.find("$((", i)
        if j < 0:
            out.append(text[i:])
            break
        try:
            end = _closing(text, j + 1, "(", ")")
        except _NoValue:
            out.append(text[i:])
            break
        out.append(text[i:j] + f"\x00{len(table)}\x00")
        table.append(text[j:end + 1])
        i = end + 1
    words = shlex.split("".join(out), comments=True)
    return [re.sub(r"\x00([0-9]+)\x00", lambda m: table[int(m[1])], w) for w in words]


_SHELL_END = re.compile(r"[0-9]*[<>].*|\||\|\||&|&&|;")
_ASSIGN_RE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_CMD_RE = re.compile(r"\bpython[0-9.]*\s+(?:-u\s+)?-m\s+(verl\.[A-Za-z0-9_.]+)")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += line
        lines.append((start, buf))
        buf = ""
    if buf:
        lines.append((start, buf))
    return lines


def read_script(path: str) -> tuple[ConfigTree, str, str]:
    """(the overrides as a tree, the config name, the module) of the launch script at ``path``."""
    label = Path(path).name
    try:
        text = decode(read_bytes(path, MAX_BYTES))
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except (LoadError, OSError) as e:
        raise InputError(f"{label}: cannot read it ({e})") from None
    if text.count("\n") > MAX_SCRIPT_LINES:
        raise InputError(f"{label}: more than {MAX_SCRIPT_LINES:,} lines")
    env: dict[str, str] = {}
    for n, line in _logical_lines(text):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        m = _CMD_RE.search(body)
        if m:
            return _command(label, n, body[m.end():], m[1], env)
        a = _ASSIGN_RE.fullmatch(body.split(" #")[0].strip())
        if a:
            try:
                words = _split(a[2])
                env[a[1]] = expand(words[0] if words else "", env)
            except _NoValue as e:  # not expandable: a later use of it is refused, naming the cause
                env[a[1]] = Unresolved(e.ref)
            except ValueError:
                env[a[1]] = Unresolved(f"line {n}, which the shell words of cannot be split")
    raise InputError(f"{label}: no `python3 -m verl....` command in the script",
                     hint="--from reads a verl launch script's `python3 -m verl.trainer.main_ppo ... key=value` lines")


def _command(label: str, line: int, rest: str, module: str, env: dict[str, str]) -> tuple[ConfigTree, str, str]:
    try:
        words = _split(rest)
    except ValueError as e:
        raise InputError(f"{label}:{line}: the verl command cannot be split into words ({e})") from None
    config_name, items, i = "", [], 0
    where = f"{label}:{line}"
    while i < len(words):
        w = words[i]
        i += 1
        if w in ("$@", "$*"):
            continue
        if _SHELL_END.fullmatch(w):  # a redirection, a pipe or the command's end: the arguments stop here
            break
        if w.startswith("--config-name") or w.startswith("--config-path"):
            if "=" not in w and i < len(words):
                w = w + "=" + words[i]
                i += 1
            if w.startswith("--config-name"):
                config_name = w.partition("=")[2].strip("'\"")
            continue
        if w.startswith("-"):
            raise InputError(f"{where}: option {w!r} of the verl command is not one --from reads")
        if "=" not in w:  # a variable holding arguments (unquoted: split into words)
            try:
                words[i:i] = expand(w, env).split()
            except _NoValue as e:
                raise InputError(f"{where}: {w[:60]!r} expands to arguments --from cannot know ({e.ref})",
                                 hint="write the overrides on the command line of the script") from None
            continue
        key = w.partition("=")[0]
        try:
            value_text = expand(w, env)
        except _NoValue as e:
            items.append((f"{key}=unresolved", where, Unresolved(f"{e.ref} (not set in the script)")))
            continue
        items.append((value_text, where, None))
    tree = apply_overrides(ConfigTree({}), [(t, w) for t, w, _ in items])
    for text, _w, unresolved in items:  # the values whose expansion failed stay marked as such
        if unresolved is not None:
            key = text.partition("=")[0].lstrip("+~")
            node = tree.data
            parts = key.split(".")
            for p in parts[:-1]:
                node = node[p]
            node[parts[-1]] = unresolved
    return tree, config_name, module


__all__ = ["MAX_SCRIPT_LINES", "Unresolved", "expand", "read_script"]
