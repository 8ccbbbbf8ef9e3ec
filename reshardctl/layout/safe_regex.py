"""Layout rule regexes (``match: "re:<regex>"``) whose matching time is bounded.

Python's ``re`` backtracks: ``(.*.*)*x`` takes exponential time on a name without an ``x``, and k
overlapping ``.*`` in a row take about n^k steps. A rule regex is matched against every tensor name of
the model (44,544 for DeepSeek-V3), so a pattern is refused unless it is in the shape that cannot blow up:

* no quantifier (``*``, ``+``, ``?``, ``{m,n}``) inside a quantified group (``(a+)*``, ``(.*.*)*``);
* no alternation inside a quantified group (``(a|ab)*``);
* no backreference, lookahead/lookbehind, conditional or atomic group;
* at most ``MAX_UNBOUNDED`` unbounded quantifiers (``*``, ``+``, ``{m,}``) in the whole pattern.

With these, a full match costs at most about n^MAX_UNBOUNDED steps for a name of n characters.
Format: docs/layouts.md ("Generic layout files").
"""

from __future__ import annotations

import re

try:
    from re import _parser as _sre  # Python >= 3.11
except ImportError:  # pragma: no cover
    import sre_parse as _sre  # type: ignore[no-redef]

MAX_UNBOUNDED = 3
_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT} | ({_sre.POSSESSIVE_REPEAT} if hasattr(_sre, "POSSESSIVE_REPEAT") else set())
_REFUSED = {_sre.GROUPREF: "a backreference", _sre.ASSERT: "a lookahead/lookbehind",
            _sre.ASSERT_NOT: "a lookahead/lookbehind", _sre.GROUPREF_EXISTS: "a conditional group"}
if hasattr(_sre, "ATOMIC_GROUP"):
    _REFUSED[_sre.ATOMIC_GROUP] = "an atomic group"


def _walk(items, in_repeat: bool, counts: list[int]) -> str | None:
    for op, av in items:
        if op in _REFUSED:
            return f"{_REFUSED[op]} is not allowed in a rule regex"
        if op in _REPEATS:
            lo, hi, body = av
            if in_repeat:
                return "a quantifier inside a quantified group (nested quantifiers backtrack exponentially)"
            if hi == _sre.MAXREPEAT:
                counts[0] += 1
            why = _walk(body, True, counts)
            if why:
                return why
        elif op == _sre.BRANCH:
            if in_repeat:
                return "an alternation (|) inside a quantified group (it backtracks exponentially)"
            for alt in av[1]:
                why = _walk(alt, in_repeat, counts)
                if why:
                    return why
        elif op == _sre.SUBPATTERN:
            why = _walk(av[-1], in_repeat, counts)
            if why:
                return why
    return None


def regex_problem(src: str) -> str | None:
    """Why ``src`` is refused as a rule regex (not a valid regex, or one that can backtrack without
    bound), or None when it is accepted."""
    try:
        re.compile(src)
        tree = _sre.parse(src)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"bad regex: {exc}"
    counts = [0]
    why = _walk(tree, False, counts)
    if why:
        return why
    if counts[0] > MAX_UNBOUNDED:
        return (f"{counts[0]} unbounded quantifiers (*, +, {{m,}}), more than the limit of {MAX_UNBOUNDED} "
                "(MAX_UNBOUNDED: each one multiplies the matching time by the name's length)")
    return None
