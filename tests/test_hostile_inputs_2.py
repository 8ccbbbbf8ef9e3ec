"""Issue 22, "Hostile inputs": every case that hung, crashed or did worse, run through the real CLI
(``python -m reshardctl`` in a subprocess): exit 2, the file and key named, no traceback, no hang.

A hang is detected by a subprocess timeout (``HANG_S``) far above the seconds these commands take; it is
not a performance limit. The Slurm cases put recording stand-ins for ``scancel``/``squeue``/``sacct``
first on PATH: they prove that no Slurm command ran (a real ``scancel --user=root`` would cancel every
root job of the shared test cluster)."""

from __future__ import annotations

import json
import math
import os
import resource
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.small_llama import SMALL_LLAMA

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 300
SLURM_COMMANDS = ("sbatch", "scancel", "squeue", "sacct", "scontrol")


def cli(tmp_path: Path, *argv: str, env: dict | None = None, limit_as: int | None = None,
        cwd: Path | None = None, timeout: float | None = None) -> tuple[int, str, str]:
    """Run ``python -m reshardctl ARGV`` with a private state directory; (exit code, stdout, stderr)."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})}

    def limit():  # an address-space limit: a multi-GiB array fails instead of swapping the machine
        resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    try:
        p = subprocess.run([sys.executable, "-m", "reshardctl", *argv], capture_output=True, text=True, env=e,
                           timeout=timeout or HANG_S, stdin=subprocess.DEVNULL, cwd=cwd or tmp_path,
                           preexec_fn=limit if limit_as else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`reshardctl {' '.join(argv)}` hung (no exit within {timeout or HANG_S} s)")
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p.returncode, p.stdout, p.stderr


def refused(tmp_path: Path, *argv: str, needles: tuple[str, ...], **kw) -> str:
    code, out, err = cli(tmp_path, *argv, **kw)
    assert code == 2, (code, out[-2000:], err[-2000:])
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    """One real bench run (tp=2 -> tp=2, one timed refit per transport) of a small Llama config:
    summary.json, session.json, events (what the hostile files replace; the model's size is beside the point)."""
    d = tmp_path_factory.mktemp("hostile-bench")
    (d / "small").mkdir()
    (d / "small" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    code, _, err = cli(d, "bench", "--model", str(d / "small"), "--train", "tp=2", "--infer", "tp=2", "--iters", "1",
                       "--warmup", "0", "--out", str(d / "bench"), timeout=1800)  # a real run, not a hang probe
    assert code == 0, err
    return d / "bench"


@pytest.fixture
def run_copy(tmp_path, bench_dir):
    """A private copy of the bench run (a hostile file replaces one of its files)."""
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(bench_dir, dst)
    return dst


def _ledger(tmp_path: Path) -> Path:
    d = tmp_path / "state" / "reshardctl"
    d.mkdir(parents=True, exist_ok=True)
    return d / "local.ledger.jsonl"


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


# ----------------------------------------------------------------------------------------- hangs ----
@pytest.mark.parametrize("what", ["ledger", "summary.json", "events", "session.json", "jobs.json", "run index"])
def test_a_fifo_is_refused_not_read(tmp_path, run_copy, what):
    if what == "ledger":
        f = _fifo(_ledger(tmp_path))
        argvs = [("status", "--site", "local"), ("rollback", "--site", "local", "--dry-run")]
    elif what == "summary.json":
        f = _fifo(run_copy / "summary.json")
        argvs = [("promote", "--site", "local", "--run", str(run_copy)), ("report", str(run_copy))]
    elif what == "events":
        f = _fifo(run_copy / "events" / "rank-0.jsonl")
        argvs = [("report", str(run_copy))]
    elif what == "session.json":
        f = _fifo(run_copy / "session.json")
        argvs = [("collect", str(run_copy))]
    elif what == "jobs.json":
        (run_copy / "slurm").mkdir()
        f = _fifo(run_copy / "slurm" / "jobs.json")
        argvs = [("cancel", str(run_copy)), ("collect", str(run_copy))]
    else:
        (tmp_path / "state" / "reshardctl").mkdir(parents=True)
        f = _fifo(tmp_path / "state" / "reshardctl" / "slurm-runs.jsonl")
        argvs = [("jobs",), ("jobs", "--all")]
    for argv in argvs:
        refused(tmp_path, *argv, needles=(f.name, "is a FIFO (named pipe), not a file"))
    assert not _ledger(tmp_path).is_file() or _ledger(tmp_path).stat().st_size == 0  # nothing recorded


def test_summary_on_dev_zero_is_not_read_unbounded(tmp_path, run_copy):
    (run_copy / "summary.json").unlink()
    (run_copy / "summary.json").symlink_to("/dev/zero")
    for argv in (("promote", "--site", "local", "--run", str(run_copy)), ("report", str(run_copy))):
        refused(tmp_path, *argv, needles=("summary.json cannot be read: is a character device, not a file",))


@pytest.mark.parametrize("pattern, why", [
    ("(.*.*)*x", "a quantifier inside a quantified group"),
    ("(a|ab)*c", "an alternation (|) inside a quantified group"),
    (".*.*.*.*x", "4 unbounded quantifiers (*, +, {m,}), more than the limit of 3"),
    ("(a)\\1", "a backreference is not allowed"),
])
def test_a_rule_regex_that_can_backtrack_without_bound_is_refused(tmp_path, pattern, why):
    f = tmp_path / "lay.yaml"
    f.write_text(yaml.safe_dump({"world_size": 4, "default": {"mesh": {"shape": [4]}, "placements": ["R"]},
                                 "rules": [{"match": f"re:{pattern}", "mesh": {"shape": [4]}, "placements": ["R"]}]}))
    refused(tmp_path, "plan", "--infer-layout", str(f), needles=(str(f), "rules[0].match", why))


def test_a_safe_rule_regex_still_matches(tmp_path):
    f = tmp_path / "lay.yaml"
    f.write_text(yaml.safe_dump({"world_size": 4, "default": {"mesh": {"shape": [4]}, "placements": ["R"]},
                                 "rules": [{"match": r"re:model\.layers\.\d+\..*_proj\.weight", "mesh": {"shape": [4]},
                                            "placements": ["Shard(0)"]}]}))
    code, out, err = cli(tmp_path, "layout", "show", "--side", "infer", "--infer-layout", str(f), "--tensor",
                         "model.layers.0.mlp.down_proj.weight", "--json")
    assert code == 0, err
    rows = json.loads(out)["sides"]["infer"]["tensors"]
    assert len(rows) == 1 and len(rows[0]["holders"]) == 4  # the rule matched: sharded 4 ways


def test_collect_refuses_a_world_of_10_to_the_12(tmp_path, run_copy):
    ctx = json.loads((run_copy / "session.json").read_text())
    (run_copy / "session.json").write_text(json.dumps({**ctx, "world": 10**12}))
    (run_copy / "slurm").mkdir()
    (run_copy / "slurm" / "jobs.json").write_text(json.dumps(
        {"run_dir": str(run_copy), "mode": "hetjob", "job_ids": {"het": "1"}, "submitted_at": 0.0}))
    refused(tmp_path, "collect", str(run_copy), needles=("session.json", "`world` must be a number of ranks from 1 "
                                                         "to 1,048,576 (MAX_WORLD), got 1000000000000"))


# ------------------------------------------------------------------------------------ tracebacks ----
def _calibration(tmp_path: Path, **over) -> Path:
    from reshardctl.site.measured import FIGURES, FORMAT

    figs = {k: (2e9 if k.endswith("bytes_per_s") else 5e-5) for k in FIGURES}
    d = {"format": FORMAT, "site": "local", "date": "2026-01-02T03:04:05Z", "hosts": ["h1"],
         "versions": {"torch": "2.13.0"}, "ranks": 8, "cores": 2, "figures": figs, **over}
    f = tmp_path / "state" / "reshardctl" / "local.calibration.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(d))
    return f


@pytest.mark.parametrize("over, needle", [
    ({"samples": [1, 2]}, "samples: expected a mapping of microbenchmark points, got list"),
    ({"date": "2026-01-02T03:04:05"}, "date: '2026-01-02T03:04:05' has no time zone"),
    ({"ranks": 0.5}, "ranks: expected an integer from 1 to 1,048,576, got 0.5"),
    ({"cores": 1e300}, "cores: expected an integer from 1 to 1,048,576, got 1e+300"),
], ids=["samples-list", "naive-date", "ranks-half", "cores-1e300"])
def test_a_bad_calibration_file_is_refused(tmp_path, over, needle):
    f = _calibration(tmp_path, **over)
    refused(tmp_path, "profile", "show", "local", needles=(f"calibration file {f}", needle))


def _entry(**over) -> dict:
    e = {"v": 1, "time": "2026-01-01T00:00:00.000Z", "user": "u", "host": "h", "site": "local", "action": "rollback",
         "transport": "gather_broadcast", "run_dir": None, "plan_fingerprint": None, "median_s": None, "p90_s": None,
         "budget_s": 1.0, "verdict": "rolled_back", "reason": None}
    return {**e, **over}


@pytest.mark.parametrize("entry, argv, needle", [
    (_entry(details={"verify": True, "verified": "yes"}), ("status", "--site", "local"),
     "`details.verified` must be true/false or null, got 'yes'"),
    (_entry(action="promote", transport="reshard", verdict="promoted",
            details={"inputs": {"model": "tiny-llama", "bogus": 1}}),
     ("rollback", "--site", "local", "--dry-run", "--verify"), "`details.inputs` has unknown keys 'bogus'"),
    (_entry(median_s=float("nan")), ("status", "--site", "local", "--json"),
     "field `median_s` must be a finite number of seconds >= 0, got nan"),
    (_entry(median_s=-5.0), ("status", "--site", "local"), "field `median_s` must be a finite number of seconds"),
], ids=["verified-yes", "inputs-unknown", "median-nan", "median-negative"])
def test_a_bad_ledger_entry_is_refused(tmp_path, entry, argv, needle):
    f = _ledger(tmp_path)
    f.write_text(json.dumps(entry) + "\n")
    code, out, err = cli(tmp_path, *argv)
    text = json.loads(out)["error"]["message"] if "--json" in argv else err
    assert code == 2 and f"ledger {f}, line 1: " in text and needle in text, (code, out, err)


def _tamper(run: Path, path: tuple, value) -> None:
    s = json.loads((run / "summary.json").read_text())
    o = s
    for k in path[:-1]:
        o = o[k]
    o[path[-1]] = value
    (run / "summary.json").write_text(json.dumps(s))


@pytest.mark.parametrize("path, value, needle", [
    (("transports", "reshard", "refit_s", "median"), -5.0, "`transports.reshard.refit_s.median` must be a finite "
                                                           "number of seconds >= 0 (or null), got '-5.0'"),
    (("transports", "reshard", "refit_s", "median"), float("nan"), "`transports.reshard.refit_s.median` must be"),
    (("transports", "reshard", "refit_s", "median"), float("inf"), "`transports.reshard.refit_s.median` must be"),
    (("transports", "reshard", "iterations"), -3, "`transports.reshard.iterations` must be an integer >= 0"),
    (("transports", "reshard", "iterations"), "x", "`transports.reshard.iterations` must be an integer >= 0"),
    (("transports", "reshard", "refit_s"), [], "`transports.reshard.refit_s` must be a JSON object"),
    (("transports", "reshard", "refit_s", "all"), ["x"], "`transports.reshard.refit_s.all[0]` must be a finite"),
    (("transports", "reshard", "failures"), [1], "`transports.reshard.failures[0]` must be a JSON object"),
    (("transports", "reshard", "verified"), "yes", "`transports.reshard.verified` must be true/false"),
    (("transports", "reshard"), [], "`transports.reshard` must be a JSON object"),
    (("inputs",), "x", "`inputs` must be a JSON object"),
    (("inputs", "model"), ["a"], "`inputs.model` must be a string"),
], ids=["median-negative", "median-nan", "median-inf", "iterations-negative", "iterations-str", "refit_s-list",
        "all-str", "failures-int", "verified-str", "transport-list", "inputs-str", "model-list"])
def test_a_tampered_summary_is_refused_by_promote_and_report(tmp_path, run_copy, path, value, needle):
    _tamper(run_copy, path, value)
    for argv in (("promote", "--site", "local", "--run", str(run_copy), "--transport", "reshard"),
                 ("report", str(run_copy), "--out", str(tmp_path / "rep"))):
        refused(tmp_path, *argv, needles=("summary.json", needle))
    assert not _ledger(tmp_path).exists() and not (tmp_path / "rep").exists()  # nothing recorded or written


def test_tampered_events_are_skipped_and_counted(tmp_path, run_copy):
    f = run_copy / "events" / "rank-0.jsonl"
    good = f.read_text().splitlines()
    bad = [{**json.loads(good[0]), "duration_s": "x"}, {**json.loads(good[0]), "bytes": "x"},
           {**json.loads(good[0]), "rank": 10**12}, {**json.loads(good[0]), "start": float("inf")}]
    f.write_text("\n".join(good + [json.dumps(b) for b in bad]) + "\n")
    code, out, err = cli(tmp_path, "report", str(run_copy), "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert "4 unreadable event lines were skipped" in (tmp_path / "rep" / "report.md").read_text()


def test_jobs_refuses_an_index_with_a_list_of_job_ids(tmp_path):
    d = tmp_path / "state" / "reshardctl"
    d.mkdir(parents=True)
    (d / "slurm-runs.jsonl").write_text(json.dumps({"run_dir": "/x", "job_ids": ["1", "2"]}) + "\n")
    refused(tmp_path, "jobs", "--all", needles=("slurm-runs.jsonl, line 1", "`job_ids` must be a JSON object"))


def test_16384_one_element_boxes_plan_in_bounded_memory(tmp_path, capsys):
    """A 400 KB layout file whose embedding template has 16,384 one-element boxes beside whole-tensor
    replicas: the box comparisons were one 16,385 x 16,385 x 2 int64 array (4 GiB); now blocks. Under a
    3 GiB address-space limit the plan succeeds (it failed with a MemoryError traceback)."""
    from reshardctl.cli import main

    assert main(["layout", "export", "--side", "infer", "--out", str(tmp_path / "inf.json")]) == 0
    capsys.readouterr()
    d = json.loads((tmp_path / "inf.json").read_text())
    d.pop("side")
    shape = d["templates"][d["tensors"]["model.embed_tokens.weight"]["template"]]["shape"]
    full = [[[0, shape[0]], [0, shape[1]]]]
    ones = [[[i, i + 1], [0, 1]] for i in range(16384)]
    d["templates"].append({"shape": shape, "slots": [full, ones, full, full]})
    d["tensors"]["model.embed_tokens.weight"]["template"] = len(d["templates"]) - 1
    f = tmp_path / "boxes.json"
    f.write_text(json.dumps(d))
    assert f.stat().st_size > 400_000
    code, out, err = cli(tmp_path, "plan", "--train-layout", str(f), "--infer-layout", str(f), "--json",
                         limit_as=3 << 30)
    assert code == 0, err[-2000:]
    assert json.loads(out)["fingerprint"]


# ------------------------------------------------------------------------------ Slurm job ids ----
@pytest.fixture
def slurm_recorder(tmp_path) -> tuple[dict, Path]:
    """(env with PATH starting at recording stand-ins of the Slurm commands, the log they append to)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "slurm-calls.log"
    for name in SLURM_COMMANDS:
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 0\n')
        p.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def _jobs_json(run: Path, job: str) -> None:
    (run / "slurm").mkdir(exist_ok=True)
    (run / "slurm" / "jobs.json").write_text(json.dumps(
        {"run_dir": str(run), "mode": "hetjob", "job_ids": {"het": job}, "submitted_at": 0.0, "scripts": [],
         "world": 4}))


@pytest.mark.parametrize("job", ["--user=root", "1,2", "1 2", "-1", "1+--user=root", ""])
def test_cancel_refuses_a_job_id_that_is_no_slurm_id(tmp_path, run_copy, slurm_recorder, job):
    env, log = slurm_recorder
    _jobs_json(run_copy, job)
    for argv in (("cancel", str(run_copy)), ("collect", str(run_copy))):
        refused(tmp_path, *argv, env=env, needles=("slurm/jobs.json: `job_ids.het`", f"{job!r} is not a Slurm job id"))
    assert not log.exists()  # no Slurm command ran


def test_collect_job_flag_and_the_index_are_checked_before_any_command(tmp_path, run_copy, slurm_recorder):
    env, log = slurm_recorder
    refused(tmp_path, "collect", "--job", "1+--user=root", str(run_copy), env=env,
            needles=("--job: '1+--user=root' is not a Slurm job id",))
    d = tmp_path / "state" / "reshardctl"
    d.mkdir(parents=True)
    (d / "slurm-runs.jsonl").write_text(json.dumps({"run_dir": "/x", "job_ids": {"het": "--user=root"}}) + "\n")
    refused(tmp_path, "jobs", env=env, needles=("slurm-runs.jsonl, line 1: `job_ids.het`: '--user=root' is not",))
    assert not log.exists()


def test_valid_job_ids_reach_the_commands_after_the_options(tmp_path, run_copy, slurm_recorder):
    env, log = slurm_recorder
    _jobs_json(run_copy, "12+1")
    squeue = Path(env["PATH"].split(":")[0]) / "squeue"  # the job is running: cancel asks, then cancels it
    squeue.write_text(f'#!/bin/sh\necho "squeue $*" >> {log}\necho "12+1|RUNNING|None|n1"\n')
    code, _, err = cli(tmp_path, "cancel", str(run_copy), env=env)
    assert code == 0, err
    assert log.read_text().splitlines() == ["squeue -h -o %i|%T|%r|%N --jobs=12+1", "scancel -- 12+1"]


def test_slurm_cli_validates_too():
    """Defence in depth: the one module that runs Slurm commands refuses a non-id itself."""
    from reshardctl.launch import slurm_cli

    for bad in ("--user=root", "1;2", "", "1_", "+1"):
        with pytest.raises(slurm_cli.JobIdError):
            slurm_cli.scancel([bad])
        with pytest.raises(slurm_cli.JobIdError):
            slurm_cli.squeue([bad])
        with pytest.raises(slurm_cli.JobIdError):
            slurm_cli.sacct([bad])
    for good in ("1", "1234_5", "1234+1"):
        assert slurm_cli.check_job_id(good, "x") == good


# ------------------------------------------------------------------------------------ outputs ----
def _device(path: Path) -> Path:
    """A character device (as /dev/null) where we can make one (root), else a FIFO: never a regular file."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("cmd", ["promote", "rollback", "calibrate", "layout-export"])
def test_outputs_never_replace_a_device(tmp_path, run_copy, cmd):
    x = _device(tmp_path / "x.yaml")
    argv = {"promote": ("promote", "--site", "local", "--run", str(run_copy), "--write", str(x)),
            "rollback": ("rollback", "--site", "local", "--write", str(x)),
            "calibrate": ("calibrate", "--site", "local", "--out", str(x)),
            "layout-export": ("layout", "export", "--side", "infer", "--out", str(x))}[cmd]
    flag = "--write" if cmd in ("promote", "rollback") else "--out"
    refused(tmp_path, *argv, needles=(f"{flag} {x}: exists and is not a regular file",))
    assert not stat.S_ISREG(x.stat().st_mode) and not _ledger(tmp_path).exists()


def test_atomic_writes_refuse_a_special_target(tmp_path):
    from reshardctl.atomic_write import StagedWrites, write_text_atomic

    x = _device(tmp_path / "x")
    with pytest.raises(OSError, match="not a regular file"):
        write_text_atomic(x, "text")
    with pytest.raises(OSError, match="not a regular file"), StagedWrites() as staged:
        staged.file(x)
    assert not stat.S_ISREG(x.stat().st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["x"]


# ------------------------------------------------------------------------------- strict JSON ----
def _strict(text: str):
    def no(c):
        raise AssertionError(f"not JSON: {c}")
    return json.loads(text, parse_constant=no)


def test_plan_json_is_strict_with_non_finite_figures(tmp_path):
    f = tmp_path / "slow.yaml"
    f.write_text("site: t\nnodes: 2\ngpus_per_node: 4\ncpu_only: true\n"
                 "links: {nvlink_gbytes_per_s: 1.0e-310, nic_gbits_per_s: 1.0e-310}\n")
    code, out, err = cli(tmp_path, "plan", "--site", str(f), "--json")
    assert code == 0, err
    d = _strict(out)
    assert d["lower_bound_s"] is None and d["non_finite"]["lower_bound_s"] == "inf"
    assert all(math.isfinite(v) for v in [d["bytes_total"]])


def test_status_json_never_prints_infinity(tmp_path):
    f = _ledger(tmp_path)
    f.write_text(json.dumps(_entry()).replace('"budget_s": 1.0', '"budget_s": 1e999') + "\n")
    code, out, err = cli(tmp_path, "status", "--site", "local", "--json")
    e = _strict(out)["error"]
    assert code == 2 and "field `budget_s` must be a finite number of seconds >= 0, got inf" in e["message"]


# ------------------------------------------------------------------------------- the rest ----
def test_layout_show_refuses_an_empty_tensor_glob(tmp_path):
    refused(tmp_path, "layout", "show", "--tensor", "", needles=("--tensor '': empty",))


def test_an_unknown_backend_variable_is_refused_before_anything_starts(tmp_path):
    refused(tmp_path, "run", "--iters", "1", "--out", str(tmp_path / "r"), env={"RESHARDCTL_BACKEND": "foo"},
            needles=("RESHARDCTL_BACKEND='foo': expected gloo, nccl, auto",))
    assert not (tmp_path / "r").exists()


def _safetensors(path: Path, header: dict) -> None:
    raw = json.dumps(header).encode()
    size = max(e["data_offsets"][1] for e in header.values())
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * size)


@pytest.mark.parametrize("second, ok", [([0, 2048], False), ([1024, 3072], False), ([2048, 4096], True)])
def test_checkpoint_tensors_sharing_bytes_are_refused(tmp_path, second, ok):
    from helpers.small_llama import SMALL_LLAMA

    d = tmp_path / "ck"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**SMALL_LLAMA, "num_hidden_layers": 1}))
    hdr = {"model.norm.weight": {"dtype": "BF16", "shape": [64, 16], "data_offsets": [0, 2048]},
           "lm_head.weight": {"dtype": "BF16", "shape": [64, 16], "data_offsets": second}}
    _safetensors(d / "model.safetensors", hdr)
    code, _, err = cli(tmp_path, "model", "show", str(d / "model.safetensors"))
    if ok:
        assert "overlaps" not in err
    else:
        assert code == 2 and "model.safetensors: " in err and "(data_offsets " in err, err
        assert "overlaps" in err and "every tensor needs bytes of its own" in err


def test_cancel_collect_status_report_bad_input_as_exit_2(tmp_path, run_copy):
    refused(tmp_path, "cancel", str(tmp_path / "nope"), needles=("not a Slurm run directory (no slurm/jobs.json)",))
    refused(tmp_path, "collect", str(run_copy), needles=("not a Slurm run directory (no slurm/jobs.json)",))
    _ledger(tmp_path).mkdir()
    refused(tmp_path, "status", "--site", "local", needles=("local.ledger.jsonl: cannot be read: is a directory",))


def test_an_expert_map_fifo_is_refused_not_read(tmp_path):
    from reshardctl.layout.expert_maps import load_expert_map_file

    problems: list[str] = []
    assert load_expert_map_file(str(_fifo(tmp_path / "map.json")), 4, 4, (1,), problems) is None
    assert problems == [f"expert_map={tmp_path / 'map.json'}: not readable JSON (is a FIFO (named pipe), not a file)"]


# ------------------------------------------------- run.json and events files read by jobs/collect ----
@pytest.fixture(scope="module")
def ended_job(tmp_path_factory) -> str:
    """The id of a real het job (two components) that ended, COMPLETED in the test cluster's accounting:
    `collect` finds its final record at once. An id accounting never knew made every `collect` below
    wait out the accounting lag (launch/slurm.py ``SACCT_LAG_S``, 15 s) first; without a cluster that is
    still what happens (the id below), slower but the same checks."""
    import shutil
    import time

    if shutil.which("sbatch") is None:
        return "999999"
    script = tmp_path_factory.mktemp("ended-job") / "het.sh"
    script.write_text("#!/bin/sh\n#SBATCH --output=/dev/null\n#SBATCH --ntasks=1\n#SBATCH hetjob\n"
                      "#SBATCH --ntasks=1\ntrue\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip().split(";")[0]
    for _ in range(600):  # a hang guard (5 min), not a time limit: it ends within seconds
        rows = subprocess.run(["sacct", "-n", "-P", "-X", "--format=JobID,State", f"--jobs={job}"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        if sum(r.startswith(f"{job}+") and r.endswith("|COMPLETED") for r in rows) == 2:
            return job
        time.sleep(0.5)
    pytest.fail(f"the test cluster's accounting never recorded job {job} as COMPLETED")


def _unsettled_slurm_run(tmp_path: Path, run: Path, job: str) -> None:
    """Make ``run`` look like a Slurm run of this tool: in the run index, with ``slurm/jobs.json``."""
    _jobs_json(run, job)
    d = tmp_path / "state" / "reshardctl"
    d.mkdir(parents=True, exist_ok=True)
    (d / "slurm-runs.jsonl").write_text(json.dumps({"run_dir": str(run), "site": "local", "mode": "hetjob",
                                                    "job_ids": {"het": job}, "submitted_at": 0.0}) + "\n")


@pytest.mark.slurm
@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_fifo_or_zero_run_json_is_refused_or_skipped_not_read(tmp_path, run_copy, ended_job, target):
    """``run.json`` is read by `jobs` (settling a run) and `collect`: a FIFO hung both (before the
    bounded read), /dev/zero was read without bound. Now `collect` refuses it (exit 2, the file named)
    and `jobs` lists the run with a note naming it; `status` and `report` do not read it."""
    _unsettled_slurm_run(tmp_path, run_copy, ended_job)
    f = run_copy / "run.json"
    f.unlink()
    kind = "is a FIFO (named pipe), not a file" if target == "fifo" else "is a character device, not a file"
    os.mkfifo(f) if target == "fifo" else f.symlink_to("/dev/zero")
    refused(tmp_path, "collect", str(run_copy), needles=(f"{f}: cannot be read: {kind}",))
    for argv in (("jobs",), ("jobs", "--all")):
        code, out, err = cli(tmp_path, *argv)
        assert code == 0, err
        assert f"note: {run_copy} not settled: {f}: cannot be read: {kind}" in err.replace("\n", ""), err
    assert "".join(out.split()).count(str(run_copy)) == 1  # --all still lists the run (the table may wrap it)
    for argv in (("status", "--site", "local"), ("report", str(run_copy), "--out", str(tmp_path / "rep"))):
        code, _, err = cli(tmp_path, *argv)
        assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(f).st_mode) or os.path.islink(f)  # nothing replaced it


@pytest.mark.slurm
@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_fifo_or_zero_events_file_is_skipped_with_a_note_by_collect(tmp_path, run_copy, ended_job, target):
    """`collect` (building summary.json: drills, where lost ranks stopped) read every events file plainly:
    a FIFO hung it. Now the file is skipped and named in summary.json's ``record_errors`` and in the
    error (exit 1: the record is incomplete); `report` refuses it (exit 2)."""
    _unsettled_slurm_run(tmp_path, run_copy, ended_job)
    f = run_copy / "events" / "rank-0.jsonl"
    f.unlink()
    kind = "is a FIFO (named pipe), not a file" if target == "fifo" else "is a character device, not a file"
    os.mkfifo(f) if target == "fifo" else f.symlink_to("/dev/zero")
    code, _, err = cli(tmp_path, "collect", str(run_copy))
    assert code == 1, err
    assert f"{f}: {kind} (skipped)" in err.replace("\n", ""), err
    summary = json.loads((run_copy / "summary.json").read_text())
    assert f"{f}: {kind} (skipped)" in summary["record_errors"]
    assert summary["knock_on_failures"] == 3  # the other ranks' events were still read
    refused(tmp_path, "report", str(run_copy), needles=(f"rank-0.jsonl: cannot be read: {kind}",))
    code, _, err = cli(tmp_path, "jobs", "--all")
    assert code == 0, err


def test_live_progress_reads_skip_a_fifo_or_zero_events_file(tmp_path, run_copy):
    """The launcher's progress reads (``commits_by_side``, ``ranks_with_phase``) and ``read_events`` on a
    FIFO and a symlink to /dev/zero among real event logs, in a child process (a hang is a timeout):
    skipped or refused, the real logs counted."""
    events = run_copy / "events"
    os.mkfifo(events / "rank-98.jsonl")
    (events / "rank-99.jsonl").symlink_to("/dev/zero")
    code = ("import sys; from pathlib import Path\n"
            "from reshardctl.runs.records import commits_by_side, ranks_with_phase, read_events, unreadable_logs\n"
            "from reshardctl.bounded_load import LoadError\n"
            "d = Path(sys.argv[1])\n"
            "print(commits_by_side(d), ranks_with_phase(d, 'materialise'), len(read_events(d / 'rank-0.jsonl')) > 0)\n"
            "for n in ('rank-98.jsonl', 'rank-99.jsonl'):\n"
            "    try: read_events(d / n)\n"
            "    except LoadError as e: print(n, e)\n"
            "print(unreadable_logs(d))\n")
    try:
        p = subprocess.run([sys.executable, "-c", code, str(events)], capture_output=True, text=True, timeout=HANG_S,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("a progress read hung on a FIFO events file")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "{'train': 6, 'infer': 6} 4 True", lines  # 2+2 ranks, 3 transports x 1 refit
    assert lines[1] == "rank-98.jsonl is a FIFO (named pipe), not a file"
    assert lines[2] == "rank-99.jsonl is a character device, not a file"
    assert "rank-98.jsonl: is a FIFO (named pipe), not a file (skipped)" in lines[3]
    assert "rank-99.jsonl: is a character device, not a file (skipped)" in lines[3]


# -------------------------------------------- issue 28: every reader of a run directory, runs/records.py ----
DEEP_EVENT = '{"phase":"group_init","rank":0,"start":1.0,"duration_s":1.0,"x":' + "[" * 100_000  # json.loads: RecursionError


@pytest.mark.parametrize("what, needle", [
    ("truncated", "summary.json cannot be read"),
    ("newer-format", "`format` is 'reshardctl-summary/2'"),
    ("request-str", "`request` must be a JSON object (or null), got 'tiny-llama'"),
])
def test_a_truncated_or_newer_summary_is_refused_by_promote_and_report(tmp_path, run_copy, what, needle):
    f = run_copy / "summary.json"
    s = json.loads(f.read_text())
    f.write_text({"truncated": json.dumps(s)[:-9], "newer-format": json.dumps({**s, "format": "reshardctl-summary/2"}),
                  "request-str": json.dumps({**s, "request": "tiny-llama"})}[what])
    for argv in (("promote", "--site", "local", "--run", str(run_copy), "--transport", "reshard"),
                 ("report", str(run_copy), "--out", str(tmp_path / "rep"))):
        refused(tmp_path, *argv, needles=(f"{run_copy}: summary.json", needle))
    assert not _ledger(tmp_path).exists() and not (tmp_path / "rep").exists()  # nothing recorded or written


@pytest.mark.parametrize("what, needle", [
    ("truncated", "cannot be read"),
    ("newer-format", "`format` is 'reshardctl-session/2'; this reshardctl reads 'reshardctl-session/1'"),
    ("request-list", "`request` must be a JSON object (the refit request) or null"),
    ("dev-zero", "cannot be read: is a character device, not a file"),
])
def test_a_truncated_newer_or_special_session_json_is_refused_by_collect(tmp_path, run_copy, slurm_recorder, what,
                                                                          needle):
    env, log = slurm_recorder
    _jobs_json(run_copy, "999999")
    before = (run_copy / "summary.json").read_bytes()
    f = run_copy / "session.json"
    ctx = json.loads(f.read_text())
    f.unlink()
    if what == "dev-zero":
        f.symlink_to("/dev/zero")
    else:
        f.write_text({"truncated": json.dumps(ctx)[:-9], "newer-format": json.dumps({**ctx, "format": "reshardctl-session/2"}),
                      "request-list": json.dumps({**ctx, "request": ["tiny-llama"]})}[what])
    refused(tmp_path, "collect", str(run_copy), env=env, needles=(str(f), needle))
    assert not log.exists()  # refused before any Slurm command ran
    assert (run_copy / "summary.json").read_bytes() == before  # nothing written


@pytest.mark.slurm
def test_a_deeply_nested_or_huge_event_line_is_skipped_by_report_and_collect(tmp_path, run_copy, ended_job):
    """One event parser (runs/records.parse_event, bounded): the report read lines with ``json.loads`` (a
    deeply nested line was a RecursionError traceback), and so did collect's Slurm readiness time (when
    accounting has the jobs' start) for lines holding "group_init"; now both skip such a line."""
    with (run_copy / "events" / "rank-0.jsonl").open("a") as fh:
        fh.write(DEEP_EVENT + "\n" + json.dumps({"phase": "x", "rank": 0, "pad": "y" * (8 << 20)}) + "\n")
    code, _, err = cli(tmp_path, "report", str(run_copy), "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert "2 unreadable event lines were skipped" in (tmp_path / "rep" / "report.md").read_text()
    _unsettled_slurm_run(tmp_path, run_copy, ended_job)
    code, _, err = cli(tmp_path, "collect", str(run_copy))
    assert code == 1, err  # the jobs left no reports: a failed run, summarised
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["knock_on_failures"] == 3 and summary["slurm"]["mode"] == "hetjob"
