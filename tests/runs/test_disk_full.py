"""A full disk under the run directory (issue 22, item 7): a real, tiny tmpfs as ``--out``'s file system.

The error names the file the disk refused, the exit code is 1, ``run.json`` always ends in a final state,
and a refit the ranks committed is still recorded (``run.json``'s ``result``, or ``summary.json``), the
ranks going on without the event lines the disk refused. Needs root (``mount``); skipped, and says so,
where mounting is not permitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from reshardctl.cli import main

LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]


@pytest.fixture
def tiny_fs(tmp_path):
    """A 200 KiB tmpfs mounted for the test, unmounted after it."""
    d = tmp_path / "tiny"
    d.mkdir(mode=0o700)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k,mode=0700", "tmpfs", str(d)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}): a full disk needs a small real file system")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (mount: {proc.stderr.strip()}): needs root / CAP_SYS_ADMIN")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)


def _fill(fs: Path, leave_kib: int = 0) -> None:
    """Write a filler file until ``leave_kib`` KiB are free (0: until the disk refuses)."""
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    want = max(0, free - leave_kib * 1024) if leave_kib else None
    n = 0
    with open(fs / f"filler-{time.monotonic_ns()}", "wb", buffering=0) as f:
        try:
            while want is None or n < want:
                n += f.write(b"\0" * min(4096, (want - n) if want is not None else 4096))
        except OSError:
            pass


def _run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def test_a_full_disk_before_the_ranks_start_names_the_file(tiny_fs, small_llama, capsys):
    out = tiny_fs / "run"
    _fill(tiny_fs, leave_kib=12)
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "1", "--transport", "reshard",
                 "--out", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1, err
    assert "Traceback" not in err and f"{out}/" in err and ": No space left on device" in err
    assert "could not be prepared; nothing was started" in err
    rec = _run_json(out)
    assert rec["state"] == "failed" and rec["record_error"].endswith(": No space left on device")
    assert rec["record_error"].split(":")[0] in err  # the same file, named in both


def test_ranks_that_committed_on_a_full_disk_are_still_recorded(tiny_fs, small_llama, capsys):
    """The disk fills up while the ranks run (after their first commit): they go on and commit every
    refit without the event lines it refuses; summary.json cannot be written, so run.json (whose space
    was held from the start) ends "finished" with the outcome and the file it could not write."""
    out = tiny_fs / "run"
    filled = threading.Event()

    def fill_after_first_commit() -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            ev = out / "events"
            try:
                if ev.is_dir() and any('"phase":"commit"' in f.read_text() for f in ev.glob("rank-*.jsonl")):
                    _fill(tiny_fs)
                    filled.set()
                    return
            except OSError:
                pass
            time.sleep(0.02)

    th = threading.Thread(target=fill_after_first_commit, daemon=True)
    th.start()
    code = main(["run", "--model", small_llama, *LAYOUT, "--iters", "60", "--warmup", "0", "--transport", "reshard",
                 "--out", str(out), "--timeout-s", "30"])
    th.join()
    io = capsys.readouterr()
    assert filled.is_set()
    err = " ".join(io.err.split())
    assert code == 1, err
    assert "Traceback" not in err
    assert "the refit committed on every rank (verified), but its record could not be written:" in err
    assert f"{out}/summary.json: No space left on device" in err
    assert "events/rank-" in err and "event(s) not written" in err  # the ranks' refused event lines
    rec = _run_json(out)
    assert rec["state"] == "finished"
    assert rec["record_error"] == f"{out}/summary.json: No space left on device"
    res = rec["result"]
    assert res["ok"] is True and res["transports"]["reshard"]["verified"] is True
    assert res["transports"]["reshard"]["iterations"] == 60 and res["transports"]["reshard"]["committed_steps_agree"]
    assert not (out / "summary.json").exists()
    assert "reshard" in io.out  # the table was printed all the same


def test_run_json_is_rewritten_in_place_when_the_disk_refuses_a_new_file(tiny_fs):
    from reshardctl.runs.rundir import RUN_JSON_BYTES, mark_run, run_state

    who = {"user": "u", "uid": 0, "host": "elsewhere", "pid": 1}
    mark_run(tiny_fs, "running", who, 1.0)
    assert (tiny_fs / "run.json").stat().st_size == RUN_JSON_BYTES
    _fill(tiny_fs)
    with pytest.raises(OSError):  # the disk is full indeed
        (tiny_fs / "probe").write_bytes(b"x" * 8192)
    mark_run(tiny_fs, "finished", who, 1.0, record_error="x/summary.json: No space left on device",
             result={"ok": True, "error": "e" * 5000})  # too big for the reserve: the result is dropped
    rec = _run_json(tiny_fs)
    assert rec["state"] == "finished" and rec["record_error"] == "x/summary.json: No space left on device"
    assert "result" not in rec and run_state(tiny_fs) == "finished"
    assert not [p for p in tiny_fs.iterdir() if p.name.startswith(".run.json.")]  # no temp file left
