"""Shared test fixtures."""

from __future__ import annotations

import json
import os

import pytest

from helpers.slurm_cluster import require_cluster
from helpers.small_llama import SMALL_LLAMA


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory, monkeypatch):
    """Calibration files live in $XDG_STATE_HOME/reshardctl/: every test gets an empty one, so no
    test reads (or writes) the user's calibrations."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def small_llama(tmp_path) -> str:
    """Path of the small llama's config.json (its own directory)."""
    d = tmp_path / "small"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SMALL_LLAMA))
    return str(d / "config.json")


@pytest.fixture(scope="module")
def cluster():
    """The local Slurm cluster (tests/slurm/cluster-up.sh): the test skips without one, or fails under
    RESHARDCTL_REQUIRE_SLURM=1."""
    require_cluster()


# ---- backends: CPU tests run gloo on any host; GPU (NCCL) tests only when asked ---------------------
GPU_FLAG = "RESHARDCTL_TEST_GPU"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs and NCCL; runs only with RESHARDCTL_TEST_GPU=1 (make test-gpu)")
    config.addinivalue_line("markers", f"slurm: uses the local Slurm cluster; under pytest-xdist every such test runs in "
                                       f"one worker, one at a time (xdist_group {SLURM_GROUP!r})")


# ---- parallel workers (pytest-xdist, `make test`: -n with --dist loadgroup) --------------------------
# Tests run in several worker processes; a test leaves its worker only through what it shares:
# * the local Slurm cluster (4 nodes, one accounting): every test that submits to it (the `cluster`
#   fixture or the `slurm` marker) runs in the group SLURM_GROUP, one after the other in one worker, so
#   no job waits in the queue behind another test's and the timing bounds stay the run's own;
# * a module-scoped fixture (a spawned world measured once and read by several tests): the tests that
#   use one run in their module's group, so it is built once, not once per worker.
# Everything else a test touches is its own: tmp_path, XDG_STATE_HOME (above), ports from the OS,
# environment changes through monkeypatch (per process).
SLURM_GROUP = "slurm"
FREE_MODULE_FIXTURES = {"cluster"}  # module-scoped but nothing to share (a check that the cluster answers)


def _xdist_group(item) -> str | None:
    if item.get_closest_marker("slurm") is not None or "cluster" in item.fixturenames:
        return SLURM_GROUP
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        if name not in FREE_MODULE_FIXTURES and defs and defs[-1].scope in ("module", "package", "class"):
            return f"module:{item.path.relative_to(item.config.rootpath)}"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get(GPU_FLAG) == "1":
        return
    skip = pytest.mark.skip(reason=f"GPU test: set {GPU_FLAG}=1 (make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _pin_backend(request, monkeypatch):
    """Every test that is not marked gpu runs its ranks on gloo/CPU, even on a host with GPUs."""
    if "gpu" not in request.keywords:
        monkeypatch.setenv("RESHARDCTL_FORCE_CPU", "1")
