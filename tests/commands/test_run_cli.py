"""`reshardctl run` and `reshardctl bench` end to end: real processes, real bytes, the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.small_llama import SMALL_LLAMA as SMALL


@pytest.fixture
def small(small_llama) -> str:
    return small_llama


def test_run_writes_a_complete_run_directory(tmp_path, small, capsys):
    out = tmp_path / "run"
    code = main(["run", "--model", small, "--train", "tp=2,pp=2", "--infer", "tp=2,dp=2", "--iters", "2",
                 "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == json.loads((out / "summary.json").read_text())
    s = summary["transports"]["reshard"]
    assert summary["ok"] and s["verified"] and s["failures"] == []
    assert s["iterations"] == 2 and len(s["refit_s"]["all"]) == 2 and all(x > 0 for x in s["refit_s"]["all"])
    assert s["refit_s"]["median"] >= s["transfer_s"]["median"] > 0
    # tp=2 x dp=2 inference: two copies of the model (no vocab padding at vocab 256), and in each the
    # norms held by both tp ranks
    from reshardctl.models import load_model

    m = load_model(small)
    norms = sum(t.nbytes for t in m.tensors if t.role == "norm")
    assert s["bytes_needed"] == 2 * (m.num_bytes + norms)
    assert (out / "plan-reshard.npz").is_file() and (out / "plan.json").is_file()
    assert "run" in (out / "command.txt").read_text()
    events = sorted((out / "events").glob("rank-*.jsonl"))
    assert len(events) == 8
    phases = {json.loads(line)["phase"] for f in events for line in f.read_text().splitlines()}
    assert {"rendezvous", "group_init", "materialise", "verify", "commit"} <= phases
    commits = [json.loads(line) for f in events for line in f.read_text().splitlines() if '"commit"' in line]
    # no --transport: the profile's transport (reshard) and gather_broadcast beside it, on the same processes
    # (one rendezvous per rank); per transport 1 warm-up + 2 timed refits on 8 ranks
    assert set(summary["transports"]) == {"reshard", "gather_broadcast"}
    assert summary["transports"]["gather_broadcast"]["verified"]
    assert summary["speedup_vs_reshard"]["gather_broadcast"] > 0
    assert len(commits) == 8 * 6 and all(c.get("committed") for c in commits)
    assert sorted(c["transport"] for c in commits) == ["gather_broadcast"] * 24 + ["reshard"] * 24
    for f in events:
        assert sum('"rendezvous"' in line for line in f.read_text().splitlines()) == 1
    assert out.name == "run" and (out / "plan-gather_broadcast.npz").is_file()


def test_run_with_transport_runs_that_one_only_and_says_faster_or_slower(tmp_path, small, capsys):
    out = tmp_path / "one"
    code = main(["run", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--transport", "hybrid", "--out", str(out), "--json"])
    assert code == 0
    assert set(json.loads(capsys.readouterr().out)["transports"]) == {"hybrid"}


def test_render_hides_empty_columns_and_names_faster_or_slower(capsys, monkeypatch):
    from reshardctl.commands.run import NEXT_STEPS, render

    monkeypatch.setenv("COLUMNS", "200")  # wide enough for every column: narrow widths are test_table_width's

    def tr(median, verified=True):
        st = {"median": median, "p90": median, "min": median, "all": [median]}
        return {"refit_s": st, "transfer_s": st, "verify_s": st, "effective_gbps": 1.0, "predicted_s": 0.5,
                "measured_vs_predicted": 2.0, "peak_staging_bytes": 10, "verified": verified, "failures": []}

    summary = {"ok": True, "run_dir": "/r", "transports": {"reshard": tr(1.0), "gather_broadcast": tr(4.0)},
               "speedup_vs_reshard": {"reshard": 1.0, "gather_broadcast": 4.0}}
    render(summary)
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "raw ceiling" not in header and "of ceiling" not in header  # not measured by run: not shown
    assert "vs reshard" in header and "predicted" in header
    assert "4.00x slower" in out and "predicted" in out and "measured/pred." in out
    assert "reshard was 4.00x faster than gather_broadcast" in out and "both verified" in out
    run_next = NEXT_STEPS["run"]
    assert out.rstrip().endswith(run_next) and "--launcher slurm" in run_next and "reshardctl bench" in run_next
    summary["speedup_vs_reshard"]["gather_broadcast"] = 0.5
    render(summary)
    out = capsys.readouterr().out
    assert "2.00x faster" in out and "reshard was 2.00x slower than gather_broadcast" in out
    render({**summary, "transports": {"reshard": tr(1.0)}, "speedup_vs_reshard": {"reshard": 1.0}})
    out = capsys.readouterr().out
    assert "vs reshard" not in out.splitlines()[0] and "reshard was" not in out


def test_bench_runs_all_transports_on_the_same_processes(tmp_path, small, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1", "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["transports"]) == {"reshard", "gather_broadcast", "hybrid"}
    for s in summary["transports"].values():
        assert s["verified"] and s["raw_baseline_s"] > 0 and s["transfer_vs_raw"] > 0
    assert summary["speedup_vs_reshard"]["reshard"] == pytest.approx(1.0)
    # one session: one rendezvous per rank, whatever the number of transports
    for f in (out / "events").glob("rank-*.jsonl"):
        assert sum('"rendezvous"' in line for line in f.read_text().splitlines()) == 1


def test_a_corrupted_refit_fails_and_says_so(tmp_path, small, capsys):
    out = tmp_path / "bad"
    code = main(["run", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "2", "--out", str(out),
                 "--inject", "corrupt:rank=3:step=2"])
    assert code == 1
    def no_nan(x):
        raise AssertionError(f"summary.json is not strict JSON: {x}")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=no_nan)
    s = summary["transports"]["reshard"]
    assert not summary["ok"] and not s["verified"]
    assert s["failures"][0]["rank"] == 3 and s["failures"][0]["error"] == "VerificationError"
    assert summary["root_cause"]["rank"] == 3 and summary["knock_on_failures"] == 3
    assert summary["drills"][0]["drill"] == "corrupt rank 3 in phase transfer at step 2"
    io = capsys.readouterr()
    assert "not committed" in io.err and "Traceback" not in io.err
    # the error on stderr only: the root cause, then the 3 other ranks in one line
    assert io.err.index("root cause: rank 3") < io.err.index("3 other ranks stopped because of it")
    assert "root cause" not in io.out and "VerificationError" not in io.out


def test_a_killed_rank_is_in_the_summary_and_printed_first(tmp_path, small, capsys):
    out = tmp_path / "dead"
    code = main(["run", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "2", "--out", str(out),
                 "--timeout-s", "5", "--inject", "kill:rank=2:phase=transfer:step=2"])
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    first = summary["transports"]["reshard"]["failures"][0]
    assert (first["rank"], first["error"], first["root_cause"]) == (2, "RankLost", True)
    assert summary["detection_s"] is not None and summary["detection_s"] <= 5 + 10
    io = capsys.readouterr()
    assert "root cause: rank 2 (infer 0" in io.err and "root cause" not in io.out
    assert f"detection: all 3 other ranks stopped within {summary['detection_s']:.2f} s" in io.out


def test_a_failed_run_says_its_root_cause_once_on_stderr(tmp_path, small):
    """Through the real CLI (a process of its own, real stdout and stderr) with a real drill: the root
    cause once, on stderr; the other ranks summarised in one line, none of their messages repeated; stdout
    holds the results (table, run directory, detection time) and no error. Four ranks (tp=2 -> tp=2): three
    knock-on failures show the summary as well as seven did, for half the rank processes."""
    import subprocess
    import sys

    out = tmp_path / "kill"
    p = subprocess.run([sys.executable, "-m", "reshardctl", "run", "--model", small, "--train", "tp=2",
                        "--infer", "tp=2", "--iters", "1", "--timeout-s", "10", "--out", str(out),
                        "--inject", "kill:rank=3:phase=transfer"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    both = p.stdout + p.stderr
    assert both.count("root cause") == 1 and p.stderr.count("killed by signal 9") == 1
    assert "root cause: rank 3 (infer 1" in p.stderr and "RankLost" in p.stderr
    assert "3 other ranks stopped because of it: " in p.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["knock_on_failures"] == 3 and s["error"] in p.stderr  # summary.json says what stderr says
    # no knock-on message (each one repeats the root cause) on either stream
    for f in s["transports"]["reshard"]["failures"][1:]:
        assert f["message"] not in both
    for word in ("root cause", "RankLost", "TransferError", "Abandoned", "failed:", "signal 9"):
        assert word not in p.stdout, word
    assert f"run directory: {out}" in p.stdout and "detection: all 3 other ranks stopped within" in p.stdout
    # stderr: the progress lines (plain: stderr is a pipe), the last saying the run failed, then the error
    # paragraph, short
    assert "Traceback" not in both
    progress, error = p.stderr.split("\nfailed: ", 1)
    assert progress.splitlines()[-1] == "ranks ended: the run failed (below)" and len(error.splitlines()) <= 3


def test_retry_with_fallback_from_the_cli(tmp_path, small, capsys):
    out = tmp_path / "retry"
    code = main(["run", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "2", "--out", str(out),
                 "--inject", "corrupt:rank=3:step=2", "--retries", "1", "--on-failure", "fallback", "--json"])
    assert code == 0
    s = json.loads(capsys.readouterr().out)["transports"]["reshard"]
    assert s["verified"] and [a["transport"] for a in s["attempts"]] == ["reshard", "gather_broadcast"]


def test_run_rejects_bad_layouts_before_starting_anything(tmp_path, small, capsys):
    out = tmp_path / "never"
    code = main(["run", "--model", small, "--train", "tp=3", "--out", str(out)])
    assert code == 2
    assert "tp=3" in capsys.readouterr().err
    assert not out.exists()


def test_run_from_a_real_safetensors_checkpoint(tmp_path, capsys):
    """Trainer ranks read their slices from a real checkpoint written by the safetensors library; the
    full check compares every destination box with the checkpoint's bytes."""
    import torch
    from safetensors.torch import save_file

    from reshardctl.models import load_model

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL))
    m = load_model(str(d / "config.json"))
    g = torch.Generator().manual_seed(0)
    save_file({t.name: torch.randn(t.shape, generator=g).to(torch.bfloat16) for t in m.tensors}, str(d / "model.safetensors"))
    out = tmp_path / "run"
    code = main(["run", "--model", str(d), "--checkpoint", str(d), "--train", "tp=2", "--infer", "tp=2,dp=2",
                 "--iters", "1", "--full-check", "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    s = json.loads(capsys.readouterr().out)["transports"]["reshard"]
    assert s["verified"] and s["iterations"] == 1


@pytest.mark.parametrize("what", ["missing", "garbage", "wrong shapes"])
def test_a_bad_checkpoint_is_bad_input_before_any_process_starts(tmp_path, small, capsys, what):
    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "ckpt"
    if what == "garbage":
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    elif what == "wrong shapes":
        ckpt.mkdir()
        save_file({"model.embed_tokens.weight": torch.zeros(3, 3, dtype=torch.bfloat16)}, str(ckpt / "model.safetensors"))
    out = tmp_path / "never"
    code = main(["run", "--model", small, "--checkpoint", str(ckpt), "--train", "tp=2", "--infer", "tp=2", "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert str(ckpt) in err.replace("\n", "")
    assert not out.exists()


def test_bench_runs_a_subset_of_transports_and_refuses_unknown_ones(tmp_path, small, capsys):
    out = tmp_path / "two"
    code = main(["bench", "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--transport", "gather_broadcast", "--transport", "reshard", "-o", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary["transports"]) == ["reshard", "gather_broadcast"]  # the usual order, each once
    assert all(s["verified"] for s in summary["transports"].values())
    assert main(["bench", "--model", small, "--transport", "m2n", "-o", str(tmp_path / "never")]) == 2
    assert "'m2n'" in capsys.readouterr().err and not (tmp_path / "never").exists()


@pytest.mark.parametrize("extra,needle", [
    (["--inject", "kill:rank=99"], "--inject: rank 99 is outside the run's 8 ranks"),
    (["--out", "NONEMPTY"], "the directory is not empty"),
])
def test_a_run_refused_for_its_inputs_prints_the_error_alone(tmp_path, small, capsys, extra, needle):
    """Refused before any process starts: exit 2, the error alone on stderr (no "what runs" line, no
    progress line before it), nothing on stdout."""
    full = tmp_path / "full"
    full.mkdir()
    (full / "old").write_text("x")
    argv = ["run", "--model", small, *[str(full) if a == "NONEMPTY" else a for a in extra]]
    assert main(argv) == 2
    io = capsys.readouterr()
    assert io.out == "" and io.err.startswith("error: ") and needle in io.err
    assert "transports" not in io.err and len(io.err.strip().splitlines()) <= 2
    assert sorted(p.name for p in full.iterdir()) == ["old"]


def _reshard_site(tmp_path) -> tuple[str, Path]:
    """A site whose profile says reshard, with its own ledger (state_dir)."""
    import yaml

    from helpers.runbook_helpers import site_profile

    state = tmp_path / "state"
    path = site_profile(tmp_path, "follow", budget_s=60, state_dir=state)
    data = yaml.safe_load(open(path))
    data["refit"]["transport"] = "reshard"
    open(path, "w").write(yaml.safe_dump(data))
    return path, state


def test_run_and_bench_without_transport_follow_the_ledger_and_the_flag_still_wins(tmp_path, small, capsys):
    """After `rollback --site S` a run without --transport runs gather_broadcast first (the profile says
    reshard) and its summary, session.json and printed summary name the ledger entry; --transport wins
    without reading the ledger."""
    site, state = _reshard_site(tmp_path)
    layout = ["--site", site, "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1", "--warmup", "0"]
    assert main(["rollback", "--site", site, "--reason", "drill"]) == 0
    entry = json.loads((state / "local.ledger.jsonl").read_text().splitlines()[0])
    capsys.readouterr()

    out = tmp_path / "followed"
    assert main(["run", *layout, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary["transports"]) == ["gather_broadcast", "reshard"]  # the active one, then the comparison
    want = {"transport": "gather_broadcast", "decided_by": "ledger", "note": None,
            "ledger_entry": {"line": 1, "action": "rollback", "time": entry["time"], "user": entry["user"],
                             "transport": "gather_broadcast"}}
    assert summary["transport_source"] == want
    assert json.loads((out / "session.json").read_text())["transport_source"] == want
    from reshardctl.runs.records import read_summary

    assert read_summary(out).transport_source == want
    commits = [json.loads(line) for f in (out / "events").glob("rank-*.jsonl") for line in f.read_text().splitlines()
               if '"phase":"commit"' in line]
    first = min(c["step"] for c in commits)
    assert {c["transport"] for c in commits if c["step"] == first} == {"gather_broadcast"}

    assert main(["bench", *layout, "--out", str(tmp_path / "bench")]) == 0
    printed = capsys.readouterr().out
    assert "transport gather_broadcast: the site's active transport, from its ledger (line 1: rollback by" in printed
    bench = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert list(bench["transports"]) == ["reshard", "gather_broadcast", "hybrid"]  # every candidate measured
    assert bench["transport_source"] == want

    # --transport wins, and the ledger is not even read (a torn line in it: no warning)
    with open(state / "local.ledger.jsonl", "a") as f:
        f.write('{"v": 1, "torn\n')
    assert main(["run", *layout, "--transport", "reshard", "--out", str(tmp_path / "flag")]) == 0
    io = capsys.readouterr()
    assert "transport reshard: chosen by --transport" in io.out and "warning" not in io.err
    flagged = json.loads((tmp_path / "flag" / "summary.json").read_text())
    assert set(flagged["transports"]) == {"reshard"}
    assert flagged["transport_source"] == {"transport": "reshard", "decided_by": "flag", "ledger_entry": None,
                                           "note": None}


def test_run_with_an_unusable_ledger_warns_and_runs_the_profiles_transport(tmp_path, small, capsys):
    site, state = _reshard_site(tmp_path)
    state.mkdir()
    (state / "local.ledger.jsonl").write_text('{"v": 1, "torn\n')
    assert main(["run", "--site", site, "--model", small, "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                 "--warmup", "0", "--out", str(tmp_path / "r2"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: ledger") == 1 and "line 1" in err and "using the profile's refit.transport" in err
    src = json.loads((tmp_path / "r2" / "summary.json").read_text())["transport_source"]
    assert src["transport"] == "reshard" and src["decided_by"] == "profile" and "line 1" in src["note"]
