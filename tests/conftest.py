"""Shared test fixtures."""

from __future__ import annotations

import json

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


def pytest_collection_modifyitems(config, items):
    import os

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
