"""Fixtures of the tests that run on the local Slurm cluster (test_slurm_cluster.py, test_slurm_bounds.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def model(small_llama) -> str:
    return small_llama  # conftest's small llama: 2 layers, whole tensors small


@pytest.fixture
def slurm_state(tmp_path, monkeypatch):
    """The run index of this test only (the Slurm test modules use it for every test)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
