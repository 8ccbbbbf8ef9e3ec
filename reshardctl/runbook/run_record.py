"""A finished run directory as evidence: its summary, and the request that re-plans it.

``summary.json`` is read, typed and checked by ``runs/records.py`` (``read_summary``: fields read
with ``.get``, since sessions from newer code may add fields and older ones may lack some). The inputs
that produced the run are the ``RefitRequest`` the session recorded whole in ``summary.json``
(``"request"``), read strictly (``recorded_request``), so the re-plan sees the same model, MTP layers,
layouts, bucket size and relay.
"""

from __future__ import annotations

from pathlib import Path

from reshardctl.errors import InputError
from reshardctl.request.request import RefitRequest
from reshardctl.runs.records import SummaryRecord, read_summary


RunRecord = SummaryRecord  # a finished run as evidence: summary.json, typed and checked (runs/records.py)


def load_run(run_dir: str | Path, flag: str = "--run") -> RunRecord:
    """``summary.json`` of ``run_dir`` as evidence (``runs/records.read_summary``)."""
    return read_summary(run_dir, flag)


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
