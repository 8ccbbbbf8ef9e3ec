"""A finished run directory as evidence: its summary, and the request that re-plans it.

``summary.json`` fields are read with ``.get``: sessions from newer code may add fields (a Slurm
section, a predicted-time breakdown) and older ones may lack some. The inputs that produced the run are
the ``RefitRequest`` the session recorded whole in ``summary.json`` (``"request"``), read strictly
(``recorded_request``), so the re-plan sees the same model, MTP layers, layouts, bucket size and relay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, loads_json, read_text
from reshardctl.errors import InputError
from reshardctl.request.request import RefitRequest

MAX_SUMMARY_BYTES = 64 << 20  # summary.json: per-rank records of a few thousand ranks


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    summary: dict[str, Any]

    @property
    def inputs(self) -> dict[str, Any]:
        return self.summary.get("inputs") or {}

    @property
    def site(self) -> str | None:
        return self.inputs.get("site")

    @property
    def model(self) -> str | None:
        return self.inputs.get("model")

    @property
    def layouts(self) -> tuple[str | None, str | None]:
        return self.inputs.get("train"), self.inputs.get("infer")

    @property
    def transports(self) -> dict[str, dict]:
        return self.summary.get("transports") or {}

    def figure(self, transport: str, key: str = "median") -> float | None:
        s = self.transports.get(transport) or {}
        v = (s.get("refit_s") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else None

    def verified(self, transport: str) -> bool:
        s = self.transports.get(transport) or {}
        return bool(s.get("verified")) and not s.get("failures") and (s.get("iterations") or 0) > 0

    def fingerprint(self, transport: str) -> str | None:
        return (self.transports.get(transport) or {}).get("fingerprint")


_NONE = type(None)
_SECONDS = "a finite number of seconds >= 0"
# summary.json keys that promote, rollback and report read -> what they must hold ("seconds": a finite
# number >= 0, "count": an integer >= 0, else JSON types); None is always allowed (an older summary)
SUMMARY_KEYS: dict[str, Any] = {
    "command": (str,), "iterations": "count", "warmup": "count", "ok": (bool,), "interrupted": (bool,),
    "error": (str,), "inputs": (dict,), "transports": (dict,), "slurm": (dict,),
}
INPUT_KEYS: dict[str, Any] = {k: (str,) for k in ("site", "model", "model_source", "train", "infer")}
TRANSPORT_KEYS: dict[str, Any] = {
    "fingerprint": (str,), "iterations": "count", "verified": (bool,), "failures": (list,), "refit_s": (dict,),
    "predicted_s": "seconds", "lower_bound_s": "seconds",
}
FIGURE_KEYS: dict[str, Any] = {"median": "seconds", "p90": "seconds", "min": "seconds", "all": (list,)}


def _kind_problem(value: Any, want: Any) -> str | None:
    """Why ``value`` is not ``want`` (a tuple of JSON types, "seconds" or "count"), or None when it is."""
    if value is None:
        return None
    if want == "seconds":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        return None if ok else _SECONDS
    if want == "count":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "an integer >= 0"
    if isinstance(value, want) and (bool in want or not isinstance(value, bool)):
        return None
    return " or ".join({"str": "a string", "bool": "true/false", "dict": "a JSON object", "list": "a list"}[t.__name__]
                       for t in want)


def _check(where: str, obj: dict, keys: dict[str, Any], prefix: str) -> None:
    for key, want in keys.items():
        why = _kind_problem(obj.get(key), want)
        if why is not None:
            raise InputError(f"{where}: `{prefix}{key}` must be {why} (or null), got {str(obj.get(key))[:80]!r}",
                             hint="summary.json is written by `reshardctl run`/`bench`: was it edited?")


def check_summary(summary: Any, where: str) -> None:
    """Refuse (``InputError`` naming the key) a summary whose fields the runbook and the report read have
    the wrong type, or a time or count that is negative, NaN or infinite."""
    if not isinstance(summary, dict) or not isinstance(summary.get("transports"), dict):
        raise InputError(f"{where}: has no `transports` mapping")
    _check(where, summary, SUMMARY_KEYS, "")
    _check(where, summary.get("inputs") or {}, INPUT_KEYS, "inputs.")
    for name, s in summary["transports"].items():
        if not isinstance(s, dict):
            raise InputError(f"{where}: `transports.{name}` must be a JSON object, got {str(s)[:80]!r}")
        _check(where, s, TRANSPORT_KEYS, f"transports.{name}.")
        fig = s.get("refit_s") or {}
        _check(where, fig, FIGURE_KEYS, f"transports.{name}.refit_s.")
        for i, v in enumerate(fig.get("all") or []):
            if _kind_problem(v, "seconds"):
                raise InputError(f"{where}: `transports.{name}.refit_s.all[{i}]` must be {_SECONDS}, got {v!r}")
        for i, f in enumerate(s.get("failures") or []):
            if not isinstance(f, dict):
                raise InputError(f"{where}: `transports.{name}.failures[{i}]` must be a JSON object, got {str(f)[:80]!r}")


def load_run(run_dir: str | Path, flag: str = "--run") -> RunRecord:
    path = Path(run_dir)
    f = path / "summary.json"
    if not path.is_dir():
        raise InputError(f"{flag} {run_dir}: no such run directory")
    try:
        summary = loads_json(read_text(f, MAX_SUMMARY_BYTES))
    except LoadError as exc:
        if exc.missing:
            raise InputError(f"{flag} {run_dir}: no summary.json (not a run directory of `reshardctl run`/`bench`, "
                             "or the run was interrupted before it was summarised)") from None
        raise InputError(f"{flag} {run_dir}: summary.json cannot be read: {exc}") from None
    check_summary(summary, f"{flag} {run_dir}: summary.json")
    return RunRecord(path.resolve(), summary)


def recorded_request(run: RunRecord) -> RefitRequest:
    """The request ``run`` recorded in its ``summary.json`` (``InputError`` when it has none: an older
    reshardctl's run, or a bad one: the key named). The model is the absolute path summary.json recorded
    when that path still exists, and layout files found from here are made absolute (the run's working
    directory is not recorded; the ledger keeps these paths)."""
    where = f"run {run.run_dir}: summary.json"
    obj = run.summary.get("request")
    if obj is None:
        raise InputError(f"{where} has no `request`: this run was recorded by an older reshardctl; bench again",
                         hint="the runbook re-plans a run from the request its summary.json holds")
    req = RefitRequest.from_json(obj, where=where)
    paths = {k: str(Path(v).resolve()) for k in ("train_layout", "infer_layout")
             if (v := getattr(req, k)) and Path(v).is_file()}
    src = run.inputs.get("model_source")
    if isinstance(src, str) and Path(src).is_absolute() and Path(src).exists():
        paths["model"] = src
    return req.replace(**paths)
