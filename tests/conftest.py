"""Shared test fixtures."""

from __future__ import annotations

import json

import pytest

# A small llama (2 layers, hidden 64, vocab 256): whole tensors fit in a test's memory and time.
SMALL_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}


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
