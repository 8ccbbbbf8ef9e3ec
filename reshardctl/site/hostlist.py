"""Slurm hostlist expressions -> tuple of host names.

Grammar (what Slurm's ``scontrol show hostnames`` accepts, minus its rarer corners):

    hostlist := item ("," item)*          commas inside brackets belong to the bracket
    item     := (text | "[" ranges "]")+  every bracket multiplies: "r[1-2]n[1-3]" = 6 names
    ranges   := range ("," range)*
    range    := digits | digits "-" digits

Zero padding is kept: the width of a range is the width of its low bound ("gpu[001-032]" ->
gpu001 ... gpu032; "n[8-10]" -> n8 n9 n10). Order is kept and duplicates are not removed (the profile
loader rejects duplicate node names itself).
"""

from __future__ import annotations

import itertools

from reshardctl.errors import ProfileError

#: refuse to expand absurd expressions ("n[0-999999999]") into memory
MAX_HOSTS = 1_000_000


def _bad(expr: str, why: str) -> ProfileError:
    return ProfileError(f"bad hostlist {expr!r}: {why}")


def _too_many(expr: str, what: str, n: int, limit: int) -> ProfileError:
    before = f" with the {MAX_HOSTS - limit} hosts before it" if limit < MAX_HOSTS else ""
    return _bad(expr, f"{what} has {n} hosts: more than the maximum of {MAX_HOSTS}{before} (MAX_HOSTS)")


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets; check bracket balance on the way."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise _bad(expr, f"nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise _bad(expr, f"']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise _bad(expr, "'[' is never closed")
    items.append(expr[start:])
    return items


def _expand_ranges(expr: str, body: str, limit: int = MAX_HOSTS) -> list[str]:
    if not body:
        raise _bad(expr, "empty brackets '[]'")
    out: list[str] = []
    count = 0
    for part in body.split(","):  # count first: "[1-999999,1-999999,...]" must not be built
        lo, sep, hi = part.partition("-")
        if lo.isascii() and lo.isdigit() and (not sep or (hi.isascii() and hi.isdigit())):
            count += max(1, int(hi) - int(lo) + 1) if sep else 1
    if count > limit:
        raise _too_many(expr, f"[{body}]", count, limit)
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo or (sep and not hi):
            raise _bad(expr, f"range {part!r} is incomplete (expected N or N-M)")
        if not (lo.isascii() and lo.isdigit()) or (sep and not (hi.isascii() and hi.isdigit())):
            raise _bad(expr, f"range {part!r} is not made of digits (expected N or N-M, e.g. 001-032)")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if a > b:
            raise _bad(expr, f"range {part!r} runs backwards ({a} > {b})")
        if b - a + 1 > limit:  # pragma: no cover - counted above
            raise _too_many(expr, f"range {part!r}", b - a + 1, limit)
        width = len(lo)
        out.extend(f"{n:0{width}d}" for n in range(a, b + 1))
    return out


def _expand_item(expr: str, item: str, limit: int = MAX_HOSTS) -> list[str]:
    # item alternates text and bracket bodies: "a[1-2]b[3]" -> ["a", "1-2", "b", "3", ""]
    pieces: list[list[str]] = []
    rest = item
    while "[" in rest:
        text, _, rest = rest.partition("[")
        body, _, rest = rest.partition("]")
        pieces.append([text])
        pieces.append(_expand_ranges(expr, body, limit))
    pieces.append([rest])
    total = 1
    for p in pieces:
        total *= len(p)
    if total > limit:
        raise _too_many(expr, repr(item), total, limit)
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(expr: str, limit: int = MAX_HOSTS) -> tuple[str, ...]:
    """Expand a Slurm hostlist expression: ``"gpu[001-003],login"`` -> ``("gpu001", "gpu002", "gpu003", "login")``.

    Raises ``ProfileError`` (message names the expression and the problem) for unbalanced or nested
    brackets, empty items, backwards or non-numeric ranges, whitespace inside names, and expansions
    of more than ``limit`` (default ``MAX_HOSTS``) names, counted before any name is built.
    """
    if not isinstance(expr, str):
        raise ProfileError(f"bad hostlist {expr!r}: expected a string such as 'gpu[001-032]'")
    text = expr.strip()
    if not text:
        raise _bad(expr, "it is empty")
    hosts: list[str] = []
    for item in _split_top_level(text):
        item = item.strip()
        if not item:
            raise _bad(expr, "empty host name (two commas in a row, or a leading/trailing comma)")
        if any(ch.isspace() for ch in item):
            raise _bad(expr, f"whitespace inside {item!r}")
        if len(hosts) >= limit:
            raise _bad(expr, f"more than the maximum of {MAX_HOSTS} hosts (MAX_HOSTS)")
        hosts.extend(_expand_item(expr, item, limit - len(hosts)))
    return tuple(hosts)
