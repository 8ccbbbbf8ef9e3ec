"""Progress of `plan` and `layout export` (work that takes seconds on the largest presets at large worlds:
deepseek-v3 at 256+256 ranks with --compare-infer x 3 plans in ~6 s): the planner's stages on stderr once
the work has taken longer than ``progress.LONG_WORK_S`` (here 0, so a tiny plan shows them too), plain
lines when piped; the plan and the files written are the same with and without it (the planner only
calls back)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from reshardctl.cli import main
from reshardctl.commands import progress
from reshardctl.commands.progress import LiveProgress

STAGES = ["planning and costing reshard (0/4)", "planning and costing gather_broadcast (1/4)",
          "planning and costing hybrid (2/4)", "NeMo RL's own refit (3/4)"]


def _without_timings(x):
    """The plan report without its ``planning_s`` wall-clock figures (the only values that may differ)."""
    if isinstance(x, dict):
        return {k: _without_timings(v) for k, v in x.items() if k != "planning_s"}
    if isinstance(x, list):
        return [_without_timings(v) for v in x]
    return x


def _plan(capsys, monkeypatch, out: Path, show_after: float) -> str:
    monkeypatch.setattr(progress, "LONG_WORK_S", show_after)
    capsys.readouterr()
    assert main(["plan", "--model", "tiny-llama", "--transport", "all", "--out", str(out)]) == 0
    return capsys.readouterr().err


def test_piped_plan_says_its_stages_as_plain_lines_and_plans_the_same(tmp_path, capsys, monkeypatch):
    err = _plan(capsys, monkeypatch, tmp_path / "with", 0.0)
    assert "\r" not in err
    lines = err.splitlines()
    said = [line for line in lines if line in STAGES]
    assert said == STAGES, err  # every stage, in order, one plain line each
    assert any(line.startswith("planned 3 transport(s) in ") for line in lines), err
    quiet = _plan(capsys, monkeypatch, tmp_path / "without", 1e9)  # never long enough: no stage said
    assert not [line for line in quiet.splitlines() if line in STAGES or line.startswith("planned ")], quiet
    a, b = (json.loads((tmp_path / d / "plan.json").read_text()) for d in ("with", "without"))
    assert json.dumps(_without_timings(a), sort_keys=True) == json.dumps(_without_timings(b), sort_keys=True)
    assert a["fingerprint"] == b["fingerprint"]


def test_plan_report_with_a_listener_returns_the_same_report(tmp_path):
    from reshardctl.plan_report import plan_report
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    heard: list[tuple[str, int, int]] = []
    inp = prepare(RefitRequest(model="tiny-llama", transport="all"), compare=["tp=4"])
    plans_a, a = plan_report(inp)
    plans_b, b = plan_report(inp, lambda what, done, total: heard.append((what, done, total)))
    assert json.dumps(_without_timings(a), sort_keys=True) == json.dumps(_without_timings(b), sort_keys=True)
    assert {t: p.fingerprint for t, p in plans_a.items()} == {t: p.fingerprint for t, p in plans_b.items()}
    assert [h[1] for h in heard] == list(range(5)) and {h[2] for h in heard} == {5}
    assert heard[-1][0] == "ranking 2 inference layouts"
    assert plans_a and set(plans_a) == set(a["transports"])


def test_layout_export_says_its_stages_and_writes_the_same_file(tmp_path, capsys, monkeypatch):
    files = {}
    for name, show_after in (("with", 0.0), ("without", 1e9)):
        monkeypatch.setattr(progress, "LONG_WORK_S", show_after)
        capsys.readouterr()
        files[name] = tmp_path / f"{name}.json"
        assert main(["layout", "export", "--model", "tiny-llama", "--side", "infer", "--infer", "tp=2",
                     "--out", str(files[name])]) == 0
        err = capsys.readouterr().err
        stages = ["building the infer layout (1/4)", "listing every rank's boxes (2/4)", f"writing {files[name]} (3/4)"]
        said = [line for line in err.splitlines() if line in stages]
        assert said == (stages if name == "with" else []), err
    assert files["with"].read_bytes() == files["without"].read_bytes()


@pytest.mark.parametrize("tty", [False, True])
def test_show_after_starts_on_the_first_update_that_late(tty):
    t = [0.0]
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=tty, width=100)
    prog = LiveProgress(con, "first", clock=lambda: t[0], show_after_s=1.0)
    prog.update(0, 3, "early stage")  # 0 s: quick work says nothing
    assert not prog.started and buf.getvalue() == ""
    t[0] = 1.5
    prog.update(1, 3, "late stage")
    assert prog.started
    prog.stop("done")
    text = buf.getvalue()
    assert "early stage" not in text and text.rstrip().endswith("done")
    if not tty:
        assert text.splitlines() == ["late stage (1/3)", "done"]


def test_without_out_the_transports_are_planned_side_by_side_and_report_the_same(monkeypatch):
    """``keep_plans=False`` (plan without --out / --export-transfers): the parts in forked workers, one stage
    for all of them, no plans back; the report is the one the parts give in this process."""
    from reshardctl.plan_report import plan_report
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    monkeypatch.setenv("RESHARDCTL_PLAN_WORKERS", "2")
    for model, infer in (("tiny-llama", "tp=2"), ("tiny-qwen3-moe", "tp=2,ep=2")):
        inp = prepare(RefitRequest(model=model, infer=infer, transport="all"), compare=["tp=4"])
        kept, a = plan_report(inp)
        heard: list[tuple[str, int, int]] = []
        none, b = plan_report(inp, lambda what, done, total: heard.append((what, done, total)), keep_plans=False)
        assert none == {} and kept
        assert json.dumps(_without_timings(a)) == json.dumps(_without_timings(b))  # key order too
        assert heard == [("planning and costing reshard, gather_broadcast, hybrid and 1 candidate layout(s) in 2 "
                          "processes", 0, 5),
                         ("ranking 2 inference layouts", 4, 5)]


@pytest.mark.parametrize("transport,relay", [("reshard", "auto"), ("gather_broadcast", "auto"), ("hybrid", "on"),
                                             ("reshard", "on")])
def test_one_transport_planned_beside_nemo_rls_refit_reports_the_same(monkeypatch, transport, relay):
    """One transport: two parts (its plan, NeMo RL's refit with the m2n verdicts where no reshard units
    give them), in two workers or in this process: the same report."""
    from reshardctl.plan_report import plan_report
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare

    monkeypatch.setenv("RESHARDCTL_PLAN_WORKERS", "2")
    inp = prepare(RefitRequest(model="tiny-qwen3-moe", train="ep=2,pp=2", infer="tp=2,dp=2", transport=transport,
                               relay=relay))
    _, a = plan_report(inp)
    _, b = plan_report(inp, keep_plans=False)
    assert list(a["transports"]) == [transport] and a["m2n_compat"]["tensors"] > 0
    assert json.dumps(_without_timings(a)) == json.dumps(_without_timings(b))
