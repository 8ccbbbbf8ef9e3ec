"""`reshardctl model show|list` through ``reshardctl.cli.main`` (which returns the exit code)."""

from __future__ import annotations

import json

import pytest

from reshardctl.cli import main
from reshardctl.models import PRESETS, load_model
from reshardctl.models.catalog import preset_config
from helpers.checkpoints import write_checkpoint


def _json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_show_json_tiny_llama(capsys):
    data = _json(capsys, ["model", "show", "tiny-llama", "--json"])
    m = load_model("tiny-llama")
    assert {"name", "source", "arch", "num_tensors", "num_params", "num_bytes", "roles"} <= set(data)
    assert (data["name"], data["source"], data["arch"]) == ("tiny-llama", "preset:tiny-llama", "llama")
    assert (data["num_tensors"], data["num_params"], data["num_bytes"]) == (39, 110_633_984, 221_267_968)
    assert data["num_params"] == m.num_params
    assert set(data["roles"]) == {"embedding", "attention", "norm", "ffn", "head"}
    assert sum(r["tensors"] for r in data["roles"].values()) == 39
    assert sum(r["params"] for r in data["roles"].values()) == m.num_params
    assert sum(r["bytes"] for r in data["roles"].values()) == m.num_bytes
    assert data["roles"]["head"] == {"tensors": 1, "params": 32000 * 1024, "bytes": 2 * 32000 * 1024}


def test_show_deepseek_checkpoint_view(capsys):
    data = _json(capsys, ["model", "show", "deepseek-v3", "--mtp", "--scales", "--json"])
    assert data["num_params"] == 684_531_386_000 and data["num_tensors"] == 91_991
    assert data["roles"]["scale"]["params"] == 41_540_496
    assert data["dims"]["num_mtp_layers"] == 1


def test_show_layers(capsys):
    data = _json(capsys, ["model", "show", "qwen3-235b-a22b", "--layers", "2", "--json"])
    assert data["num_tensors"] == 2 * 393 + 3
    assert data["num_params"] == 2 * 2_487_755_008 + 1_244_663_808
    assert data["name"] == "qwen3-235b-a22b-2L"


def test_show_human(capsys):
    assert main(["model", "show", "llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    for text in ("llama-3.1-8b", "preset:llama-3.1-8b", "LlamaForCausalLM", "291", "8,030,261,248",
                 "16,060,522,496", "15.0 GiB", "8.03B", "embedding", "attention", "head"):
        assert text in out, text


def test_show_checkpoint_directory(tmp_path, capsys):
    spec = load_model("tiny-qwen3-moe", layers=1)
    index = write_checkpoint(spec, tmp_path / "ckpt", shards=2)
    data = _json(capsys, ["model", "show", str(tmp_path / "ckpt"), "--json"])
    assert data["source"] == str(index)
    assert (data["num_tensors"], data["num_bytes"]) == (len(spec.tensors), spec.num_bytes)


def test_list(capsys):
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    for p in PRESETS:
        assert p in out
    assert "36,945" in out and "110.63M" in out
    rows = _json(capsys, ["model", "list", "--json"])
    assert [r["name"] for r in rows] == list(PRESETS)
    assert rows[PRESETS.index("llama-3.1-70b")]["num_params"] == 70_553_706_496


def _err(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, (code, captured.out, captured.err)
    return " ".join(captured.err.split())  # undo rich's line wrapping


def test_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(dict(preset_config("tiny-llama"), architectures=["GPT2LMHeadModel"])))
    err = _err(capsys, ["model", "show", str(bad)])
    assert "config.json" in err and "'architectures'" in err and "GPT2LMHeadModel" in err

    bad.write_text("{")
    assert "not valid JSON" in _err(capsys, ["model", "show", str(tmp_path)])

    missing = dict(preset_config("tiny-llama"))
    del missing["vocab_size"]
    bad.write_text(json.dumps(missing))
    assert "key 'vocab_size' is missing" in _err(capsys, ["model", "show", str(bad)])

    assert "no such file" in _err(capsys, ["model", "show", str(tmp_path / "nope.json")])
    assert "between 1 and 4" in _err(capsys, ["model", "show", "tiny-llama", "--layers", "9"])
    assert "no MTP layers" in _err(capsys, ["model", "show", "tiny-llama", "--mtp"])


@pytest.mark.parametrize("argv", [["model", "show"], ["model", "show", "tiny-llama", "--layers", "0"]])
def test_usage_errors_exit_2(capsys, argv):
    assert main(argv) == 2


@pytest.mark.parametrize("typo,preset", [("tiny-lama", "tiny-llama"), ("deepseek-v2", "deepseek-v3"),
                                         ("qwen3-235b", "qwen3-235b-a22b")])
def test_show_typo_suggests_a_preset(capsys, typo, preset):
    assert main(["model", "show", typo]) == 2
    err = capsys.readouterr().err
    assert f"did you mean the preset '{preset}'?" in err and "Traceback" not in err
