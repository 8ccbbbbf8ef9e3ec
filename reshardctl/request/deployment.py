"""A deployment read from a framework's config: the model, both parallel strings and styles, the two
world sizes, and where each value came from; and the key rules a config is checked against.

``Deployment`` is what ``request/nemo_rl_config.py`` and ``request/verl_config.py`` derive and
``request/from_config.py`` turns into a ``RefitRequest``. ``check_keys`` walks every leaf of a config
tree against a framework's rule table (first matching glob wins): ``READ`` keys are the ones the
derivation reads, ``ignore(reason)`` keys cannot change which bytes a rank holds (each reason says why),
``only(values, reason)`` keys are accepted at those values and refused at any other, and a leaf no rule
matches is refused by name: a config is never half read (docs/deployments.md lists the tables).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable

from reshardctl.errors import InputError

READ = ("read", ())
COLOCATED_WHY = (
    "colocated deployments are out of scope: the trainer and the inference engine share the same GPUs and "
    "memory, so the refit there is a device-local copy or CUDA IPC handle, not a transfer between two pools "
    "of ranks; reshardctl plans M2N transfers between separate trainer and inference pools")


def ignore(reason: str) -> tuple[str, tuple]:
    return ("ignore", (reason,))


def only(values: tuple, reason: str) -> tuple[str, tuple]:
    return ("only", (values, reason))


Rule = tuple[str, tuple[str, tuple]]


@dataclass(frozen=True)
class Source:
    """One derived value and where it came from (``file: key = value`` or a framework default)."""

    what: str
    where: str


@dataclass(frozen=True)
class Deployment:
    framework: str
    config: str
    model: str | None
    train: str
    train_style: str
    infer: str
    infer_style: str
    train_world: int
    infer_world: int
    sources: tuple[Source, ...]
    ignored: int = 0
    train_layout_needed: str | None = None  # why the trainer needs a layout file (FSDP2 sharding), if it does


def check_keys(leaves: list[tuple[str, Any]], rules: list[Rule], *, label: str,
               where: Callable[[str], str], resolve: Callable[[str], Any], framework: str) -> int:
    """Every leaf against ``rules``; the number of leaves ignored. All refusals at once (InputError)."""
    problems: list[str] = []
    ignored = 0
    matcher = _matcher(tuple(pat for pat, _ in rules))
    for path, value in leaves:
        m = matcher.fullmatch(path)
        rule = rules[int(m.lastgroup[1:])][1] if m else None
        if rule is None:
            problems.append(f"{where(path)}: `{path}` = {_show(value)}: not a key reshardctl reads for {framework}; "
                            "it may change the layout, so it is refused rather than ignored")
            continue
        kind, args = rule
        if kind == "ignore":
            ignored += 1
        elif kind == "only":
            allowed, reason = args
            got = resolve(path)
            if got not in allowed:
                problems.append(f"{where(path)}: `{path}` = {_show(got)}: refused, {reason} "
                                f"(accepted: {', '.join(_show(a) for a in allowed)})")
            else:
                ignored += 1
    if problems:
        head = f"{label}: {len(problems)} key(s) refused" if len(problems) > 1 else f"{label}: a key is refused"
        raise InputError(head + ":\n  - " + "\n  - ".join(problems[:20])
                         + (f"\n  - ... and {len(problems) - 20} more" if len(problems) > 20 else ""),
                         hint="docs/deployments.md lists the keys --from reads, ignores and refuses")
    return ignored


@functools.lru_cache(maxsize=8)
def _matcher(patterns: tuple[str, ...]) -> re.Pattern:
    """One regex for a rule table: alternative ``r<i>`` is glob ``i``; the first glob that matches the whole
    path wins, as a first-match scan of the table would."""
    return re.compile("|".join(f"(?P<r{i}>{fnmatch.translate(p)[4:-3]})" for i, p in enumerate(patterns)))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def positive_int(value: Any, *, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: `{key}` must be a positive integer, got {_show(value)}")
    return value


__all__ = ["COLOCATED_WHY", "Deployment", "READ", "Rule", "Source", "check_keys", "ignore", "only", "positive_int"]
