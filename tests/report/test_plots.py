"""The report's plots (report/plots.py, report/style.py) drawn from real run directories (a bench of three
transports and a one-transport run, real gloo ranks) and from synthetic histories for the time axis:
asserted on the figures' artists (budget line, predictions, ledger marks, units, colours, legend order)
and on the PNGs' pixel size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import matplotlib.colors as mcolors
import pytest

from reshardctl.cli import main
from reshardctl.report import plots, style
from reshardctl.report.collect import Expectation, History, LedgerMark, Refit, RunData, Segment, load_run_data

from helpers.small_llama import SMALL_LLAMA

T0 = 1_796_184_106.0  # a fixed wall-clock time: 2026-12-02 04:01:46 UTC


def _warmups_from_events(run: RunData) -> RunData:
    """Segment.warmup from the events' ``"warmup": true`` (the data layer fills it; this only fills a
    RunData whose loader did not, so the plots are tested on real warm-ups either way)."""
    if any(s.warmup for s in run.segments):
        return run
    warm = set()
    for f in sorted((run.run_dir / "events").glob("rank-*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e.get("warmup"):
                warm.add((e["rank"], e.get("step")))
    for s in run.segments:
        s.warmup = (s.rank, s.step) in warm
    return run


def _real(tmp_path_factory, name: str, command: str, *extra: str) -> RunData:
    base = tmp_path_factory.mktemp(name)
    (base / "small").mkdir()
    (base / "small" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    out = base / "run"
    with pytest.MonkeyPatch.context() as mp:  # no test reads the user's calibrations, ledgers or default site
        mp.setenv("XDG_STATE_HOME", str(base / "state"))
        mp.setenv("XDG_CONFIG_HOME", str(base / "config"))
        mp.delenv("RESHARDCTL_SITE", raising=False)
        assert main([command, "--site", "local", "--model", str(base / "small" / "config.json"), "--train", "tp=2",
                     "--iters", "2", "--out", str(out), "--json", *extra]) == 0
    return _warmups_from_events(load_run_data(out))


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> RunData:
    """A real bench: reshard, hybrid and gather_broadcast on 2 + 2 gloo ranks, a warm-up and 2 timed refits each."""
    return _real(tmp_path_factory, "bench", "bench", "--infer", "tp=2")


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> RunData:
    """A real run of gather_broadcast only, to another layout: other phases present than in the bench."""
    return _real(tmp_path_factory, "run", "run", "--infer", "tp=1,dp=2", "--transport", "gather_broadcast")


def _history() -> History:
    """A bench, API refits five minutes later (one failed), API refits three days later; decisions between."""
    def series(src, t, start, vals):
        return [Refit(src, t, k + 1, start + 0.4 * k, v, warmup=k == 0) for k, v in enumerate(vals)]
    refits = (series("bench-0", "reshard", T0, [0.6, 0.29, 0.3]) + series("bench-0", "gather_broadcast", T0 + 3,
                                                                          [1.3, 1.02, 1.25])
              + series("api-a", "reshard", T0 + 300, [0.5, 0.31, 0.33]) + [Refit("api-a", "reshard", 4, T0 + 302, 0.4,
                                                                                ok=False)]
              + series("api-b", "gather_broadcast", T0 + 3 * 86400, [1.2, 1.1]))
    exps = [Expectation("bench-0", "reshard", 0.131, 0.037, T0, T0 + 0.8),
            Expectation("bench-0", "gather_broadcast", 0.383, 0.09, T0 + 3, T0 + 3.8)]
    marks = [LedgerMark(T0 + 60, "promote", "refused", "reshard", "promote refused", False),
             LedgerMark(T0 + 120, "promote", "promoted", "reshard", "promoted reshard", True),
             LedgerMark(T0 + 2 * 86400, "rollback", "rolled_back", "gather_broadcast", "rollback (verified)", True)]
    return History("local", "tiny-llama", 0.5, refits, exps, marks)


def _gid(ax, gid: str) -> list:
    return [a for a in ax.get_children() if a.get_gid() == gid]


def _legend_labels(fig) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def _in_legend_order(labels: list[str]) -> None:
    """The kinds present appear in style.LEGEND_ORDER."""
    pos = [next(i for i, k in enumerate(style.LEGEND_ORDER) if lab.startswith(k.split(" / ")[0]))
           for lab in labels if any(lab.startswith(k.split(" / ")[0]) for k in style.LEGEND_ORDER)]
    assert pos == sorted(pos), labels


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def _readable(path: Path) -> None:
    w, h = _png_size(path)
    assert 900 <= w <= 1000 and 250 <= h <= 1400, (path.name, w, h)


# ---------------------------------------------------------------- latency over time

def test_over_time_has_budget_predictions_marks_and_a_full_legend():
    h = _history()
    fig = plots.latency_over_time_figure([h])
    ax = fig.axes[0]
    budget = _gid(ax, "budget")
    assert ax.get_ylabel() == "refit latency (s)"  # one unit for the axis: the largest value is 1.3 s
    assert len(budget) == 1 and budget[0].get_label() == "budget 0.5 s"
    assert len(_gid(ax, "predicted")) == len(_gid(ax, "lower bound")) == len(h.expectations)
    marks = _gid(ax, "mark")
    assert len(marks) == len(h.marks)
    colours = [mcolors.to_hex(m.get_color()) for m in marks]  # refused grey, promote and rollback in their own
    assert colours == [style.MARK_COLORS["declined"], style.MARK_COLORS["promote"], style.MARK_COLORS["rollback"]]
    texts = {t.get_text() for t in ax.texts}
    assert {"promote refused", "promoted reshard", "rollback (verified)"} <= texts
    labels = _legend_labels(fig)
    for kind in ("timed refit", "warm-up refit", "failed refit", "predicted", "lower bound", "budget", "promote",
                 "rollback", "refused / verify failed"):
        assert any(lab.startswith(kind) for lab in labels), (kind, labels)
    assert labels[:2] == ["reshard", "gather_broadcast"]
    _in_legend_order(labels[2:])
    kinds = ("timed refit", "warm-up refit", "failed refit")
    points = {k: sum(len(c.get_offsets()) for c in _gid(ax, k)) for k in kinds}
    assert points == {"timed refit": sum(r.ok and not r.warmup for r in h.refits),
                      "warm-up refit": sum(r.warmup for r in h.refits), "failed refit": 1}


def test_over_time_slots_read_minutes_and_days_apart():
    """Sources five minutes and three days apart each get one slot; the points inside a slot are not squeezed."""
    h = _history()
    ax = plots.latency_over_time_figure([h]).axes[0]
    xs = {}
    for coll in _gid(ax, "timed refit") + _gid(ax, "warm-up refit") + _gid(ax, "failed refit"):
        for (x, _y) in coll.get_offsets():
            xs.setdefault(int(x), []).append(float(x))
    assert sorted(xs) == [0, 1, 2]  # bench, api-a (+5 min), api-b (+3 days): one slot each
    assert max(xs[0]) - min(xs[0]) > 0.5 and max(xs[1]) - min(xs[1]) > 0.5  # spread over their slots
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[0].startswith("12-02 04:01") and ticks[2].startswith("12-05 04:01"), ticks  # UTC
    gaps = [t.get_text() for t in ax.texts if t.get_text().startswith("+")]
    assert gaps == ["+4.9 min", "+3.0 d"]
    # the refused promote (1 min after the bench) and the rollback (2 days after) fall between the slots
    mx = [m.get_xdata()[0] for m in _gid(ax, "mark")]
    assert 0.9 < mx[0] < mx[1] < 1.1 and 1.9 < mx[2] < 2.1


def test_over_time_panels_per_history_and_empty_ones():
    other = History("slurm-local", "small-llama", None, [], [], [])
    fig = plots.latency_over_time_figure([_history(), other])
    assert [a.get_title() for a in fig.axes] == ["local: tiny-llama", "slurm-local: small-llama"]
    assert any(t.get_text() == "no refits" for t in fig.axes[1].texts) and not _gid(fig.axes[1], "budget")


# ---------------------------------------------------------------- latency per transport

def test_latency_box_has_budget_predictions_and_a_legend_for_mean_and_median(bench):
    fig = plots.latency_figure([bench], budget_s=0.5)
    ax = fig.axes[0]
    allv = [v for t in bench.transports.values() for v in t["refit_s"]["all"]] + [0.5]
    unit = "s" if max(allv) >= 1 else "ms"
    assert ax.get_ylabel() == f"refit time per iteration ({unit})"
    (budget,) = _gid(ax, "budget")
    assert budget.get_label() == ("budget 500 ms" if unit == "ms" else "budget 0.5 s")
    assert len(_gid(ax, "predicted")) == len(_gid(ax, "lower bound")) == 3
    pred = sorted(float(c.get_segments()[0][0][1]) for c in _gid(ax, "predicted"))
    scale = 1e-3 if unit == "ms" else 1.0
    assert pred == pytest.approx(sorted(t["predicted_s"] / scale for t in bench.transports.values()))
    labels = _legend_labels(fig)
    assert labels[:3] == ["reshard", "hybrid", "gather_broadcast"]
    assert {"mean", "median", "predicted (plan)", "lower bound", "budget"} <= set(labels)
    _in_legend_order(labels[3:])


# ---------------------------------------------------------------- timeline

def test_timeline_sets_up_apart_marks_warmups_and_labels_steps(bench):
    fig = plots.timeline_figure(bench)
    ax_setup, ax_refit = fig.axes[:2]
    setup_phases = {s.phase for s in bench.segments if not style.is_refit_phase(s.phase)}
    assert "materialise" in setup_phases
    colours = lambda ax, gid: {mcolors.to_hex(c.get_facecolor()[0]) for c in _gid(ax, gid)}  # noqa: E731
    assert style.phase_color("materialise") in colours(ax_setup, "setup")
    assert style.phase_color("materialise") not in colours(ax_refit, "refit")
    assert ax_setup.get_xlabel().startswith("since the run's first event (")
    assert ax_refit.get_xlabel().startswith("refit time (")
    # one shaded warm-up per transport, and the timed steps labelled
    assert len(_gid(ax_refit, "warmup")) == 3
    timed = sorted({s.step for s in bench.segments if style.is_refit_phase(s.phase) and not s.warmup})
    assert sorted(int(t.get_text()[1:]) for t in _gid(ax_refit, "step")) == timed
    assert "warm-up refit" in _legend_labels(fig)


def test_a_phase_has_one_colour_and_place_in_every_timeline(bench, one_run):
    legends = []
    for run in (bench, one_run):
        fig = plots.timeline_figure(run)
        leg = fig.legends[0]
        legends.append({t.get_text(): mcolors.to_hex(p.get_facecolor())
                        for t, p in zip(leg.get_texts(), leg.get_patches())})
    common = [p for p in legends[0] if p in legends[1] and p != "warm-up refit"]
    assert "bucket/broadcast" in common and "verify" in common and "round/transfer" not in legends[1]
    for p in common:
        assert legends[0][p] == legends[1][p] == style.phase_color(p), p
    assert [p for p in legends[1] if p in common] == common  # the same order


def test_timeline_of_many_ranks_shows_the_busiest_and_stays_bounded(tmp_path):
    segs = [Segment(rank=r, side="train" if r < 32 else "infer", transport="reshard", phase=phase, step=1,
                    start=t, duration=0.01 * (1 + r % 5), bytes=1 << 20)
            for r in range(64) for phase, t in (("materialise", 0.0), ("round/transfer", 20.0), ("verify", 20.1))]
    # a set-up event that names no side (as a run's rendezvous may): still one row per rank
    segs += [Segment(rank=r, side="", transport="unknown", phase="rendezvous", step=None, start=0.0, duration=0.01)
             for r in range(64)]
    run = RunData(tmp_path / "wide", {"transports": {"reshard": {}}}, segs)
    fig = plots.timeline_figure(run)
    assert len(fig.axes[0].get_yticks()) == style.MAX_RANK_ROWS
    assert "the 32 busiest of 64 ranks" in fig.get_suptitle()
    plots.timeline(run, tmp_path / "t.png")
    _readable(tmp_path / "t.png")
    fig = plots.bytes_figure(run)
    assert len(fig.axes[0].get_xticks()) == style.MAX_RANK_ROWS and "busiest" in fig.axes[0].get_title()


# ---------------------------------------------------------------- bytes

def test_bytes_in_binary_units_below_1024(bench):
    fig = plots.bytes_figure(bench)
    ax = fig.axes[0]
    unit = ax.get_ylabel().split()[0]
    assert unit in ("KiB", "MiB", "GiB")
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert max(shown) <= 1024 and max(shown) >= 1, shown
    colours = {c.get_label(): mcolors.to_hex(c.patches[0].get_facecolor()) for c in ax.containers}
    assert colours == {t: style.transport_color(t) for t in ("reshard", "hybrid", "gather_broadcast")}


# ---------------------------------------------------------------- the PNGs

def test_every_png_reads_on_a_laptop(bench, one_run, tmp_path):
    plots.latency([bench, one_run], tmp_path / "latency.png", budget_s=0.5)
    plots.timeline(bench, tmp_path / "timeline.png")
    plots.bytes_per_rank(bench, tmp_path / "bytes.png")
    plots.latency_over_time([_history(), History("x", "y", 1.0)], tmp_path / "over-time.png")
    for name in ("latency.png", "timeline.png", "bytes.png", "over-time.png"):
        _readable(tmp_path / name)


def test_bytes_of_the_issue_read_in_mib(tmp_path):
    """175000 KiB per rank (the issue's figure) is drawn as about 171 MiB, not 175000 KiB."""
    segs = [Segment(rank=r, side="train", transport=t, phase=phase, step=1, start=0.0, duration=0.1,
                    bytes=175_000 << 10)
            for r in range(4) for t, phase in (("reshard", "round/transfer"), ("gather_broadcast", "bucket/gather"))]
    ax = plots.bytes_figure(RunData(tmp_path / "big", {"transports": {}}, segs)).axes[0]
    assert ax.get_ylabel().startswith("MiB ")
    lo, hi = ax.get_ylim()
    assert 150 <= max(t for t in ax.get_yticks() if lo <= t <= hi) <= 200
    assert max(b.get_height() for c in ax.containers for b in c.patches) == pytest.approx(175_000 / 1024)
