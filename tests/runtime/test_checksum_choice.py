"""The CPU checksum path is chosen by measurement on the machine (runtime/checksum_choice.py), never by
which instructions exist: the fastest path that passes the exactness probe wins, a wrong kernel is
refused however fast, every path gives the same checksum on the same bytes, the choice is cached per
machine (one rank of a node measures, the others read it), and RESHARDCTL_CHECKSUM_PATH forces one."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.runtime import checksum as checksum_module
from reshardctl.runtime import checksum_choice, checksum_rows

PATHS = checksum_rows.paths(torch.device("cpu"))


def _path(p):
    return lambda b, s, v, R: checksum_rows.row_sums(b, s, v, R, p)


_reference = checksum_choice.exact_row_sums


def _slowed(fn, extra_s: float):
    """A fake slow kernel: ``fn``'s exact results, ``extra_s`` later."""
    def slow(b, s, v, R):
        time.sleep(extra_s)
        return fn(b, s, v, R)
    return slow


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(checksum_choice.ENV, raising=False)
    checksum_choice.forget()
    yield tmp_path / "cache" / "reshardctl" / checksum_choice.CACHE_NAME
    checksum_choice.forget()


def test_the_fastest_exact_path_wins_over_a_slower_one_and_a_faster_wrong_one():
    """Three candidates on the real probe and timing buffers: an exact path, the same path made slow, and
    a kernel faster than both whose sums are off by one in one row (a structured error, not noise). The
    wrong one is refused, the slow one measured slower, and the choice is the exact fast one."""
    fast = _path(PATHS[0])

    def wrong(b, s, v, R):
        out = torch.zeros(s.numel(), checksum_rows.SUMS, dtype=torch.int64)
        if s.numel() > 2:
            out[2, 3] = 1
        return out
    cands = {"slow": _slowed(fast, 0.02), "wrong-but-fast": wrong, "fast": fast}
    chosen, rates, refused, copy = checksum_choice.measure(cands, lambda sizes, name: checksum_rows.C_ROW, _reference)
    assert chosen == "fast" == max(rates, key=rates.get)
    assert set(refused) == {"wrong-but-fast"} and "differ" in refused["wrong-but-fast"]
    assert rates["slow"] < rates["fast"] and copy > 0


def test_a_kernel_that_raises_is_refused_not_fatal():
    def broken(b, s, v, R):
        raise RuntimeError("no kernel for this CPU")
    chosen, rates, refused, _ = checksum_choice.measure({"broken": broken, "float64": _reference},
                                                         lambda sizes, name: 64, _reference, repeats=1)
    assert chosen == "float64" and "RuntimeError" in refused["broken"] and set(rates) == {"float64"}


def test_the_probe_catches_an_error_only_at_the_end_of_a_partial_odd_row():
    """An error a kernel makes only on the odd last byte of a partial row (the compiled kernel's tail):
    the probe's windows include such rows, so it is refused."""
    def tail_bug(b, s, v, R):
        out = _reference(b, s, v, R).clone()
        odd = ((v % 2) == 1).nonzero().flatten()
        if odd.numel():
            out[odd[0], 0] = (out[odd[0], 0] + 1) % checksum_rows.P
        return out
    assert checksum_choice.probe_failure(tail_bug, _reference) is not None
    for p in PATHS:
        assert checksum_choice.probe_failure(_path(p), _reference) is None, p


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=20_000), cuts=st.lists(st.tuples(st.integers(0, 10 ** 6),
                                                                          st.integers(0, 9000)), min_size=1, max_size=12))
def test_every_path_gives_the_same_checksum_on_the_same_bytes(data, cuts):
    buf = torch.tensor(list(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    n = buf.numel()
    offsets = [2 * (o % (n // 2 + 1)) for o, _ in cuts]
    sizes = [min(k, n - o) for o, (_, k) in zip(offsets, cuts)]
    got = {p: checksum_module._checksums(buf, offsets, sizes, p) for p in PATHS}
    for p in PATHS:
        assert torch.equal(got[p], got["float64"]), p


def test_the_compiled_kernel_refuses_windows_outside_the_buffer():
    """The kernel checks every window before it reads any: a row past the buffer's end, one longer than
    a row, or a negative start is a ValueError naming the row, never a read out of bounds."""
    compiled = [p for p in PATHS if p.startswith("c-")]
    if not compiled:
        pytest.skip("the compiled kernel was not built here")
    buf = torch.zeros(1000, dtype=torch.uint8)
    R = 64
    for start, valid in ([990, 20], [0, 2 * R + 2], [-2, 4]):
        with pytest.raises(ValueError, match="outside the buffer|longer than a row"):
            checksum_rows.row_sums(buf, torch.tensor([0, start]), torch.tensor([2, valid]), R, compiled[0])


def test_the_choice_is_measured_once_then_read_from_the_cache(fresh_cache):
    c = checksum_choice.choice()
    assert c.how == "measured" and c.path in PATHS and c.rate and c.rate == max(c.rates.values())
    entries = json.loads(fresh_cache.read_text())
    assert entries[checksum_choice.machine_key()]["path"] == c.path
    checksum_choice.forget()
    again = checksum_choice.choice()
    assert again.how.startswith("cached") and again.path == c.path and again.rates == pytest.approx(c.rates)
    assert checksum_module.path_for(torch.device("cpu")) == c.path


def test_a_damaged_cache_file_is_measured_again(fresh_cache):
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text(json.dumps({checksum_choice.machine_key(): {"path": "c-nonexistent", "rates": {}}}))
    assert checksum_choice.choice().how == "measured"
    checksum_choice.forget()
    fresh_cache.write_text("{not json")
    assert checksum_choice.choice().how == "measured"


def test_the_key_names_the_thread_count(fresh_cache):
    before = torch.get_num_threads()
    one = checksum_choice.machine_key()
    torch.set_num_threads(before + 1)
    try:
        assert checksum_choice.machine_key() != one
    finally:
        torch.set_num_threads(before)
    c1 = checksum_choice.choice(threads=1)
    assert torch.get_num_threads() == before  # restored after measuring with one thread
    assert checksum_choice.choice(threads=1) is c1


def test_a_forced_path_is_used_and_a_bad_one_is_an_error_naming_the_variable(fresh_cache, monkeypatch):
    monkeypatch.setenv(checksum_choice.ENV, "float64")
    c = checksum_choice.choice()
    assert c.path == "float64" and c.how == f"forced by {checksum_choice.ENV}" and not fresh_cache.exists()
    checksum_choice.forget()
    monkeypatch.setenv(checksum_choice.ENV, "avx9000")
    with pytest.raises(ValueError, match=f"{checksum_choice.ENV}=avx9000: not a checksum path.*float64"):
        checksum_choice.choice()


def test_a_forced_path_that_fails_its_probe_is_refused(fresh_cache, monkeypatch):
    monkeypatch.setenv(checksum_choice.ENV, "float64")
    real = checksum_rows.row_sums

    def off_by_one(b, s, v, R, path):
        out = real(b, s, v, R, path)
        if path == "float64" and s.numel():
            out = out.clone()
            out[0, 0] = (out[0, 0] + 1) % checksum_rows.P
        return out
    monkeypatch.setattr(checksum_rows, "row_sums", off_by_one)
    with pytest.raises(ValueError, match="fails its exactness probe"):
        checksum_choice.choice()


def test_ranks_that_start_together_measure_once(tmp_path):
    """Three processes with an empty cache at once (a node's ranks): the lock lets one measure, the
    others read what it wrote."""
    code = ("import torch; torch.set_num_threads(1); from reshardctl.runtime import checksum_choice as c; "
            "print(c.choice().how.split(' ')[0])")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    hows = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert hows == ["cached", "cached", "measured"], hows


@pytest.mark.parametrize("argv", [["run", "--iters", "1"], ["selftest"], ["plan"]])
def test_a_bad_forced_path_is_exit_2_naming_the_variable_before_any_rank_starts(argv, monkeypatch, capsys, tmp_path):
    from reshardctl.cli import main

    monkeypatch.setenv(checksum_choice.ENV, "avx9000")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{checksum_choice.ENV}=avx9000" in err and "float64" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing written
