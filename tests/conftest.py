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
