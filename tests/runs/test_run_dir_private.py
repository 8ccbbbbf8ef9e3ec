"""Run directories belong to the user who runs reshardctl (issue 22, item 3).

An existing ``--out`` owned by another user or writable by group/others is refused before anything is
written; every file of a run directory is 0600 and every directory 0700 (a real local run, a real Slurm
run, `plan --out`); a real rank process refuses a session file (a pickle: code that runs when loaded)
that is not its user's alone, and loads nothing. The tests chown to uid 65534 (nobody): they need root.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from reshardctl.cli import main

from helpers.slurm_cluster import cluster_problem

OTHER_UID = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]
REPO = Path(__file__).resolve().parents[2]


def _modes(root: Path) -> dict[str, int]:
    out = {".": root.stat().st_mode & 0o777}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = p.lstat().st_mode & 0o777
    return out


def _not_private(root: Path) -> dict[str, str]:
    return {k: oct(m) for k, m in _modes(root).items()
            if m != (0o700 if (root / k).is_dir() else 0o600)}


@needs_root
@pytest.mark.parametrize("command", ["run", "bench", "plan"])
def test_an_out_dir_owned_by_another_user_is_refused(tmp_path, small_llama, capsys, command):
    out = tmp_path / "theirs"
    out.mkdir(mode=0o700)
    os.chown(out, OTHER_UID, -1)
    extra = ["--iters", "1"] if command != "plan" else []
    code = main([command, "--model", small_llama, *LAYOUT, *extra, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    flat = " ".join(err.split())
    assert f"--out {out}" in flat and f"owned by uid {OTHER_UID}" in flat and "not by this process's user (uid 0" in flat
    assert list(out.iterdir()) == []  # nothing written, nothing started
    assert out.stat().st_uid == OTHER_UID and (out.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
@pytest.mark.parametrize("command", ["run", "plan"])
def test_an_out_dir_writable_by_group_or_others_is_refused(tmp_path, small_llama, capsys, mode, command):
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(mode)
    code = main([command, "--model", small_llama, *LAYOUT, "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"--out {out}" in err and f"writable by group or others (mode {mode:04o})" in err
    assert list(out.iterdir()) == []


def test_calibrate_run_dir_of_another_user_is_refused(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    d = tmp_path / "cal"
    d.mkdir(mode=0o700)
    os.chown(d, OTHER_UID, -1)
    code = main(["calibrate", "--site", "slurm-local", "--launcher", "slurm", "--run-dir", str(d),
                 "--out", str(tmp_path / "cal.json")])
    assert code == 2
    assert f"owned by uid {OTHER_UID}" in " ".join(capsys.readouterr().err.split())
    assert list(d.iterdir()) == []


def test_plan_out_is_private_new_or_existing(tmp_path, small_llama, capsys):
    new = tmp_path / "new" / "plan"
    assert main(["plan", "--site", "slurm-local", "--model", small_llama, *LAYOUT, "--out", str(new)]) == 0
    assert (new / "session.pkl").is_file() and (new / "slurm").is_dir()
    assert _not_private(new) == {}
    assert "(umask 077 && sbatch " in capsys.readouterr().err
    # an existing directory of the user's own (0755): made private, and so are the files written into it
    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o755)
    assert main(["plan", "--site", "slurm-local", "--model", small_llama, *LAYOUT, "--out", str(old)]) == 0
    assert _not_private(old) == {}


def test_a_local_run_is_private_whatever_the_umask(tmp_path, small_llama):
    """The CLI as its own process under umask 000: every file 0600, every directory 0700 all the same."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RESHARDCTL_FORCE_CPU": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import os, sys; os.umask(0); from reshardctl.cli import main; sys.exit(main())",
         "run", "--model", small_llama, *LAYOUT, "--iters", "1", "--warmup", "0", "--transport", "reshard",
         "--json", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (out / "events").is_dir() and (out / "summary.json").is_file()
    assert _not_private(out) == {}


# ---- ranks refuse a session file that is not their user's alone ---------------------------------
class _Marker:
    """Unpickling this creates the marker file: the proof that a pickle's code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _worker(session: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESHARDCTL_RANK", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), RESHARDCTL_FORCE_CPU="1")
    return subprocess.run([sys.executable, "-m", "reshardctl.runtime.worker", "--session", str(session)],
                          env=env, capture_output=True, text=True, timeout=120)


def _hostile_session(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    marker = tmp_path / "pwned"
    session = d / "session.pkl"
    session.write_bytes(pickle.dumps(_Marker(str(marker))))
    session.chmod(0o600)
    return session, marker


def test_a_rank_loads_its_users_own_session_file(tmp_path):
    """The control: the same file, private to this user, IS loaded (its code runs), so the refusals
    below are the checks, not a file that never loads."""
    session, marker = _hostile_session(tmp_path)
    proc = _worker(session)
    assert marker.exists(), proc.stderr
    assert "refused" not in proc.stderr


@pytest.mark.parametrize("change,expect", [
    ("chown-file", f"is owned by uid {OTHER_UID}"),
    ("chmod-file-0666", "is writable by group or others (mode 0666)"),
    ("chmod-file-0620", "is writable by group or others (mode 0620)"),
    ("chown-dir", f"the directory {{d}} of the session file {{f}} is owned by uid {OTHER_UID}"),
    ("chmod-dir-0777", "the directory {d} of the session file {f} is writable by group or others (mode 0777)"),
])
def test_a_rank_refuses_a_session_file_not_its_users_alone(tmp_path, change, expect):
    if change.startswith("chown") and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    session, marker = _hostile_session(tmp_path)
    d = session.parent
    if change == "chown-file":
        os.chown(session, OTHER_UID, -1)
    elif change.startswith("chmod-file"):
        session.chmod(int(change.rsplit("-", 1)[1], 8))
    elif change == "chown-dir":
        os.chown(d, OTHER_UID, -1)
    else:
        d.chmod(0o777)
    proc = _worker(session)
    assert proc.returncode == 2, proc.stderr
    assert expect.format(d=d, f=session) in proc.stderr and "refused, nothing loaded" in proc.stderr
    assert not marker.exists()  # the pickle's code never ran


def test_a_rank_refuses_a_symlinked_or_special_session_file(tmp_path):
    session, marker = _hostile_session(tmp_path)
    link = session.parent / "link.pkl"
    link.symlink_to(session)
    proc = _worker(link)
    assert proc.returncode == 2 and not marker.exists()
    fifo = session.parent / "fifo.pkl"
    os.mkfifo(fifo, 0o600)
    proc = _worker(fifo)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and not marker.exists()


def _calibration_spec(tmp_path: Path) -> Path:
    d = tmp_path / "cal"
    d.mkdir(mode=0o700)
    spec = d / "calibrate.json"
    spec.write_text(json.dumps({"per_node": 1, "reps": 1, "run_dir": str(tmp_path / "elsewhere"), "cpu_only": True}))
    spec.chmod(0o600)
    return spec


def _calibration_worker(spec: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESHARDCTL_RANK", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), RESHARDCTL_FORCE_CPU="1")
    return subprocess.run([sys.executable, "-m", "reshardctl.calibrate.worker", "--spec", str(spec)],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("change,expect", [
    (None, None),  # the control: a private spec is read (the worker goes on to its rank environment)
    ("chown-file", f"the calibration spec {{f}} is owned by uid {OTHER_UID}"),
    ("chmod-file-0666", "the calibration spec {f} is writable by group or others (mode 0666)"),
    ("chmod-dir-0777", "the directory {d} of the calibration spec {f} is writable by group or others (mode 0777)"),
    ("fifo", "the calibration spec {f} is not a regular file"),
])
def test_a_calibration_rank_refuses_a_spec_not_its_users_alone(tmp_path, change, expect):
    """A calibration rank's spec says where the rank writes (``run_dir``): read only when it is the
    user's alone, as a refit rank's session file (a real worker process)."""
    if change == "chown-file" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    spec = _calibration_spec(tmp_path)
    if change == "chown-file":
        os.chown(spec, OTHER_UID, -1)
    elif change == "chmod-file-0666":
        spec.chmod(0o666)
    elif change == "chmod-dir-0777":
        spec.parent.chmod(0o777)
    elif change == "fifo":
        spec.unlink()
        os.mkfifo(spec, 0o600)
    proc = _calibration_worker(spec)
    assert proc.returncode == 2, proc.stderr
    if expect is None:
        assert "refused" not in proc.stderr and "cannot read the spec" not in proc.stderr, proc.stderr
    else:
        assert expect.format(d=spec.parent, f=spec) in proc.stderr and "refused, nothing loaded" in proc.stderr
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("change", ["chmod-0777", "chmod-0770", "chown"])
def test_the_default_runs_base_of_another_user_or_shared_is_refused(tmp_path, small_llama, capsys, monkeypatch,
                                                                    change):
    """Without --out, runs go to ./runs/<time>-<label>: a runs/ that another user owns or may write is
    refused as --out is (they could rename the new run directory away and put theirs in its place)."""
    if change == "chown" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "runs"
    base.mkdir(mode=0o700)
    if change == "chown":
        os.chown(base, OTHER_UID, -1)
    else:
        base.chmod(int(change.split("-")[1], 8))
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    why = f"owned by uid {OTHER_UID}" if change == "chown" else f"writable by group or others (mode {change[-4:]})"
    assert f"the default base directory (no --out) runs: it is {why}" in err, err
    assert list(base.iterdir()) == []  # nothing written, nothing started


def test_the_default_runs_base_is_created_private(tmp_path, small_llama, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--model", small_llama, *LAYOUT, "--iters", "1", "--warmup", "0"]) == 0, capsys.readouterr().err
    assert (tmp_path / "runs").stat().st_mode & 0o777 == 0o700
    (run,) = (tmp_path / "runs").iterdir()
    assert _not_private(run) == {}


@pytest.mark.slurm
# ---- a real Slurm run: every file Slurm, the job script and the ranks create is private ----------
def test_a_slurm_run_dir_is_private(tmp_path, small_llama, capsys):
    why = cluster_problem()
    if why is not None:
        pytest.skip(why)
    out = tmp_path / "slurm-run"
    old = os.umask(0o022)  # the usual umask: Slurm's own files would be 0644 under it
    try:
        code = main(["run", "--site", "slurm-local", "--launcher", "slurm", "--model", small_llama, *LAYOUT,
                     "--iters", "1", "--transport", "reshard", "--out", str(out)])
    finally:
        os.umask(old)
    assert code == 0, capsys.readouterr().err
    names = set(_modes(out))
    assert {"logs/rank-0.out", "logs/rank-3.err", "reports/rank-3.json", "events/rank-0.jsonl",
            "slurm/hetjob.sbatch", "slurm/jobs.json", "session.pkl"} <= names
    assert any(n.startswith("slurm/job-") and n.endswith(".out") for n in names)  # Slurm's own output file
    assert _not_private(out) == {}
    assert os.umask(0o022) == 0o022  # the CLI restored the umask it was given
