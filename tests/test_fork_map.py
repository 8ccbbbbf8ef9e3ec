"""``fork_map``: the same results as a list comprehension, from real forked processes; failures in a child
raised here as they were (type, message, hint, exit code); a child that dies is said, and none is left
behind; ``--compare-infer`` rows the same with one worker or several."""

from __future__ import annotations

import json
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.errors import LayoutError, PlanError
from reshardctl.fork_map import WORKERS_ENV, fork_map, workers_available


def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


@settings(max_examples=15, deadline=None)
@given(items=st.lists(st.integers(-1000, 1000), max_size=9), workers=st.integers(1, 4))
def test_results_in_item_order(items, workers):
    got = fork_map(_pid_and_square, items, workers)
    assert [sq for _, sq in got] == [x * x for x in items]
    assert len({pid for pid, _ in got}) <= max(1, min(workers, len(items)))


def _until_both_work(tmp, x: int, parent: int):
    """Item ``x``: say which process took it, then wait (up to 30 s) until two processes have taken one."""
    import time

    (tmp / f"{x}-{os.getpid()}").write_text("")
    for _ in range(600):
        if len({f.name.split("-")[1] for f in tmp.iterdir()}) >= 2:
            break
        time.sleep(0.05)
    return os.getpid(), x


def test_the_work_is_really_forked_and_each_item_taken_once(tmp_path):
    parent = os.getpid()
    got = fork_map(lambda x: _until_both_work(tmp_path, x, parent), list(range(6)), 2)
    assert [x for _, x in got] == list(range(6))
    pids = {pid for pid, _ in got}
    assert len(pids) == 2 and parent in pids  # this process and one child, both at work
    taken = sorted(int(f.name.split("-")[0]) for f in tmp_path.iterdir())
    assert taken == list(range(6))  # every item by exactly one process


def test_a_free_worker_takes_the_next_item():
    """Item 0 keeps one worker for 1.5 s; the other takes every other item meanwhile (dealt round-robin, the
    busy worker would have had items 2 and 4 as well)."""
    import time

    def fn(x):
        if x == 0:
            time.sleep(1.5)
        return os.getpid()

    pids = fork_map(fn, list(range(6)), 2)
    assert len({pids[i] for i in range(1, 6)}) == 1 and pids[0] not in pids[1:]


def _fail_on(bad: int, how: str):
    def fn(x: int) -> int:
        if x == bad:
            if how == "layout":
                raise LayoutError(["tp=3 does not divide 64 heads", "pp=5 > 4 layers"], hint="try tp=4")
            if how == "plan":
                raise PlanError(f"item {x} cannot be planned", hint="a hint")
            if how == "other":
                raise ZeroDivisionError(f"item {x} divided by zero")
        return x
    return fn


@pytest.mark.parametrize("how", ["layout", "plan"])
def test_a_reshard_error_in_a_child_is_raised_here_as_itself(how):
    serial = parallel = None
    try:
        fork_map(_fail_on(5, how), range(8), 1)
    except (LayoutError, PlanError) as e:
        serial = e
    try:
        fork_map(_fail_on(5, how), range(8), 4)
    except (LayoutError, PlanError) as e:
        parallel = e
    assert type(parallel) is type(serial) and str(parallel) == str(serial)
    assert parallel.exit_code == serial.exit_code == 2 and parallel.hint == serial.hint


def test_another_exception_in_a_child_carries_its_traceback():
    with pytest.raises(RuntimeError, match=r"ZeroDivisionError: item 3 divided by zero \(in a worker process\)") as e:
        fork_map(_fail_on(3, "other"), range(6), 2)
    assert "Traceback (most recent call last)" in str(e.value) and "in fn" in str(e.value)


def _dies_in_a_child(tmp, how: str, parent: int):
    def fn(x: int) -> int:
        _until_both_work(tmp, x, parent)
        if os.getpid() != parent:  # whichever items the child took: it dies on its first
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        return x
    return fn


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_child_that_dies_is_said_and_reaped(how, tmp_path):
    with pytest.raises(RuntimeError, match="worker process .* ended with status") as e:
        fork_map(_dies_in_a_child(tmp_path, how, os.getpid()), range(4), 2)
    assert ("3" if how == "exit" else str(-signal.SIGKILL)) in str(e.value)
    import re

    pid = int(re.search(r"pid (\d+)", str(e.value)).group(1))
    with pytest.raises(ChildProcessError):  # reaped: no longer this process's child (not a zombie)
        os.waitpid(pid, os.WNOHANG)


def test_the_first_failing_item_in_item_order_wins():
    def fn(x):
        if x in (2, 5):
            raise PlanError(f"item {x}")
        return x
    with pytest.raises(PlanError, match="item 2"):
        fork_map(fn, range(8), 3)  # item order, not which worker took it or when it failed


@pytest.mark.parametrize("raw, ok", [("1", 1), (" 3 ", 3), ("0", None), ("two", None), ("-1", None)])
def test_workers_from_the_environment(monkeypatch, raw, ok):
    monkeypatch.setenv(WORKERS_ENV, raw)
    if ok is None:
        from reshardctl.errors import InputError
        with pytest.raises(InputError, match=WORKERS_ENV):
            workers_available()
    else:
        assert workers_available() == ok


def test_compare_rows_the_same_with_one_worker_or_several(tmp_path):
    """``plan --compare-infer``: the candidates planned in this process or in forked workers give the same
    rows (every figure, every fingerprint, the ranking)."""
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).parent / "reshardctl")
    argv = [exe, "plan", "--site", "dgx-h100", "--model", "qwen3-30b-a3b", "--train", "tp=2,ep=8",
            "--infer", "tp=4,dp=4", "--json", "--compare-infer", "tp=4,dp=4", "--compare-infer", "tp=2,dp=8",
            "--compare-infer", "tp=8,dp=2", "--compare-infer", "tp=1,dp=16"]
    rows = {}
    for w in ("1", "3"):
        out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, WORKERS_ENV: w})
        assert out.returncode == 0, out.stderr
        rows[w] = json.loads(out.stdout)["compare"]
    assert rows["1"] == rows["3"] and len(rows["1"]) == 5  # the current layout too (and again, named)
    assert len({r["fingerprint"] for r in rows["1"]}) == 4  # four layouts, four plans


def test_an_interrupt_here_kills_and_reaps_the_children(tmp_path):
    """This process's own share raises KeyboardInterrupt while a child is still working: the child is
    killed and reaped before the interrupt leaves ``fork_map`` (no orphan planning on, no zombie)."""
    import time

    pid_file = tmp_path / "child.pid"

    parent = os.getpid()

    def fn(x):
        if os.getpid() != parent:  # the child's item: say who it is, then work far longer than the test
            pid_file.write_text(str(os.getpid()))
            time.sleep(120)
            return x
        for _ in range(400):  # this process's item: wait until the child is at work, then be interrupted
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fork_map(fn, [0, 1], 2)
    pid = int(pid_file.read_text())
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(pid, os.WNOHANG)
    with pytest.raises(ProcessLookupError):  # and gone
        os.kill(pid, 0)
