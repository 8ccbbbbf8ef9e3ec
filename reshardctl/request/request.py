"""RefitRequest: every input that determines a refit's plan, and the run settings of a refit session.

One frozen value, built once: by the CLI (``commands/options.py``), by the API (``api.plan_refit``) and by the
runbook (from the request a run recorded). ``request/resolve.prepare`` resolves it (files read, layouts built,
every problem listed); the session writes it whole into ``session.json`` and ``summary.json`` under the key
``"request"`` (``to_json``), and the runbook reads it back from there (``from_json``) to re-plan a run.

``from_json`` is strict: an object of another or a newer format, a missing or unknown key, or a field of the
wrong type is an ``InputError`` naming the file and the key (exit 2). Values are checked where they are
used (``prepare``, the session), with the same messages as the command line's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from reshardctl.errors import InputError

FORMAT = "reshardctl-request/1"
_FORMAT_RE = re.compile(r"reshardctl-request/(\d+)")
HINT = "the request is written by `reshardctl run`/`bench`: was the file edited?"

# JSON kinds of the fields: "str", "int", "number", "bool", "str?" (a string or null), "int?", "number?",
# "strs" (a list of strings)
_KINDS = {
    "str": "a string", "int": "an integer", "number": "a finite number", "bool": "true/false",
    "strs": "a list of strings",
}


@dataclass(frozen=True)
class RunSettings:
    """How a refit session runs (`run`, `bench`, `rollback --verify`): what it measures, how it waits,
    what it does after a failure. ``launcher``/``slurm_mode``/``timeout_s`` None: the profile's."""

    transports: tuple[str, ...] = ()
    iterations: int = 5
    warmup: int = 1
    baseline: bool = False
    timeout_s: float | None = None
    retries: int = 0
    on_failure: str = "abort"
    launcher: str | None = None
    slurm_mode: str | None = None
    checkpoint: str | None = None
    full_check: bool = False
    inject: tuple[str, ...] = ()


RUN_KINDS: dict[str, str] = {
    "transports": "strs", "iterations": "int", "warmup": "int", "baseline": "bool", "timeout_s": "number?",
    "retries": "int", "on_failure": "str", "launcher": "str?", "slurm_mode": "str?", "checkpoint": "str?",
    "full_check": "bool", "inject": "strs",
}


@dataclass(frozen=True)
class RefitRequest:
    """The inputs of one refit's plan (the command line's defaults), and its run settings (None: a plan
    only). ``transport``: one transport or ``all`` (what ``prepare`` resolves and plans)."""

    site: str = "local"
    model: str = "tiny-llama"
    layers: int | None = None
    mtp: bool = False
    train: str | None = None
    infer: str | None = None
    train_style: str = "megatron"
    infer_style: str = "vllm"
    train_layout: str | None = None
    infer_layout: str | None = None
    transport: str = "all"
    bucket_mb: float | None = None
    relay: str = "auto"
    run: RunSettings | None = None

    def replace(self, **changes: Any) -> "RefitRequest":
        return replace(self, **changes)

    def plan_inputs(self) -> dict[str, Any]:
        """The fields a re-plan of the run depends on besides its site and transport (the ledger's
        ``details.inputs``, which ``rollback --verify`` replays)."""
        return {k: getattr(self, k) for k in PLAN_INPUTS}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT}
        for k in PLAN_KINDS:
            out[k] = getattr(self, k)
        out["run"] = None if self.run is None else {
            k: list(v) if isinstance(v, tuple) else v for k, v in ((k, getattr(self.run, k)) for k in RUN_KINDS)}
        return out

    @classmethod
    def from_json(cls, obj: Any, *, where: str) -> "RefitRequest":
        """The request ``to_json`` wrote; ``where`` names its file (``summary.json``, ``session.json``)."""
        if not isinstance(obj, Mapping):
            raise InputError(f"{where}: `request` must be a JSON object, got {_show(obj)}", hint=HINT)
        fmt = obj.get("format")
        if fmt != FORMAT:
            m = _FORMAT_RE.fullmatch(fmt) if isinstance(fmt, str) else None
            if m and int(m[1]) > 1:
                raise InputError(f"{where}: `request.format` is {fmt!r}: written by a newer reshardctl "
                                 f"(this one reads {FORMAT!r})", hint="read it with that reshardctl, or upgrade")
            raise InputError(f"{where}: `request.format` must be {FORMAT!r}, got {_show(fmt)}", hint=HINT)
        values = _fields(obj, PLAN_KINDS, where, "request.", extra=("format", "run"))
        run = obj["run"] if "run" in obj else _missing(where, "request.run")
        if run is not None:
            if not isinstance(run, Mapping):
                raise InputError(f"{where}: `request.run` must be a JSON object or null, got {_show(run)}", hint=HINT)
            rv = _fields(run, RUN_KINDS, where, "request.run.")
            run = RunSettings(**{k: tuple(v) if RUN_KINDS[k] == "strs" else v for k, v in rv.items()})
        return cls(**values, run=run)


PLAN_KINDS: dict[str, str] = {
    "site": "str", "model": "str", "layers": "int?", "mtp": "bool", "train": "str?", "infer": "str?",
    "train_style": "str", "infer_style": "str", "train_layout": "str?", "infer_layout": "str?",
    "transport": "str", "bucket_mb": "number?", "relay": "str",
}
PLAN_INPUTS = ("model", "layers", "mtp", "train", "infer", "train_style", "infer_style", "train_layout",
               "infer_layout", "bucket_mb", "relay")


def _show(value: Any) -> str:
    return repr(value)[:80]


def _missing(where: str, key: str):
    raise InputError(f"{where}: `{key}` is missing", hint=HINT)


def _fields(obj: Mapping, kinds: dict[str, str], where: str, prefix: str, extra: tuple[str, ...] = ()) -> dict:
    unknown = sorted(str(k) for k in obj if k not in kinds and k not in extra)
    if unknown:
        raise InputError(f"{where}: `{prefix}` has unknown keys {', '.join(map(repr, unknown))[:200]} "
                         f"(known: {', '.join((*extra, *kinds))})", hint=HINT)
    out = {}
    for key, kind in kinds.items():
        if key not in obj:
            _missing(where, prefix + key)
        value = obj[key]
        why = kind_problem(value, kind)
        if why is not None:
            raise InputError(f"{where}: `{prefix}{key}` must be {why}, got {_show(value)}", hint=HINT)
        out[key] = float(value) if kind.startswith("number") and value is not None else value
    return out


def kind_problem(value: Any, kind: str) -> str | None:
    """Why ``value`` is not of ``kind`` (a ``*_KINDS`` entry), or None when it is."""
    if kind.endswith("?"):
        if value is None:
            return None
        why = kind_problem(value, kind[:-1])
        return None if why is None else f"{why} or null"
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    else:  # strs
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return None if ok else _KINDS[kind]


__all__ = ["FORMAT", "PLAN_INPUTS", "RefitRequest", "RunSettings"]
