"""How local ranks start (launch/local.py ``start_method``): gloo ranks fork from a server that imported
torch once, NCCL ranks are spawned; a forked rank takes the launcher's environment and standard
output and error as they are when it starts, not as they were when the fork server started."""

from __future__ import annotations

import os

import pytest

from reshardctl.errors import LaunchError
from reshardctl.launch import local

from helpers import start_probe


def test_gloo_ranks_fork_from_the_server_nccl_ranks_are_spawned(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_START_METHOD", raising=False)
    assert local.start_method("gloo") == "forkserver"
    assert local.start_method("nccl") == "spawn"  # nothing CUDA-related crosses a fork
    monkeypatch.setenv("RESHARDCTL_START_METHOD", "spawn")
    assert local.start_method("gloo") == "spawn"
    monkeypatch.setenv("RESHARDCTL_START_METHOD", "fork")
    with pytest.raises(LaunchError, match="RESHARDCTL_START_METHOD='fork': expected spawn or forkserver"):
        local.start_method("gloo")


def _probe(ctx, inherited, capfd) -> tuple[str, str]:
    p = ctx.Process(target=start_probe.report, args=(inherited,))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0
    out = capfd.readouterr()
    return out.out, out.err


def test_a_forked_rank_takes_the_launchers_environment_and_output_as_they_are_now(capfd, monkeypatch):
    ctx = local._context("forkserver")
    monkeypatch.delenv("RESHARDCTL_PROBE", raising=False)
    _probe(ctx, local._Inherited(dict(os.environ)), capfd)  # the server runs from here on (or already did)
    monkeypatch.setenv("RESHARDCTL_PROBE", "now")  # set after the server started: only what is passed counts
    out, err = _probe(ctx, local._Inherited(dict(os.environ)), capfd)
    assert "probe=now" in out  # the environment as it is at the start, and the output where it goes now
    assert "probe-err" in err
    out, _ = _probe(ctx, None, capfd)  # without it: the server's environment, its output
    assert "probe=now" not in out
