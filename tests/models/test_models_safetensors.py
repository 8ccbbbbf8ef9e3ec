"""Round trip through real safetensors files: index + headers give the same spec as config.json."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from reshardctl.errors import ModelError
from reshardctl.models import load_model, spec_from_config, spec_from_safetensors_index
from reshardctl.models.catalog import preset_config
from reshardctl.models.checkpoint import read_safetensors_header
from reshardctl.models.spec import ModelSpec
from helpers.checkpoints import write_checkpoint


def _triples(spec: ModelSpec):
    return [(t.name, t.shape, t.dtype) for t in spec.tensors]


def _sum_data_bytes(index: Path) -> int:
    weight_map = json.loads(index.read_text())["weight_map"]
    sizes = {}
    for file in set(weight_map.values()):
        for name, (dtype, shape) in read_safetensors_header(index.parent / file).items():
            sizes[name] = torch.zeros((), dtype=getattr(torch, dtype)).element_size() * torch.Size(shape).numel()
    return sum(sizes.values())


@pytest.mark.parametrize("preset,layers,full", [
    ("tiny-llama", 2, False),
    ("tiny-qwen3-moe", 2, False),
    ("tiny-deepseek", 2, True),  # checkpoint view: MTP layer + fp8 weights + weight_scale_inv
])
def test_round_trip(tmp_path, preset, layers, full):
    config = dict(preset_config(preset), num_hidden_layers=layers)
    expected = spec_from_config(config, "ckpt", include_mtp=full, include_scales=full)
    index = write_checkpoint(expected, tmp_path / "ckpt", config=config)
    assert len({*json.loads(index.read_text())["weight_map"].values()}) == 3
    assert json.loads(index.read_text())["metadata"]["total_size"] == expected.num_bytes == _sum_data_bytes(index)

    from_index = spec_from_safetensors_index(index)
    assert _triples(from_index) == _triples(expected)  # same order, names, shapes, dtypes
    assert from_index.tensors == expected.tensors and from_index.dims == expected.dims
    assert from_index.source == str(index) and from_index.name == "ckpt"

    # the directory (index present) and an index path give the same as the spec_from_config view
    assert load_model(tmp_path / "ckpt", include_mtp=full, include_scales=full).tensors == expected.tensors
    assert load_model(index, include_mtp=full, include_scales=full).tensors == expected.tensors
    # default view of the checkpoint == default view of its config (MTP and scales dropped)
    assert load_model(index).tensors == spec_from_config(config, "x").tensors

    # a directory with only config.json gives the same spec
    only = tmp_path / "only-config"
    only.mkdir()
    (only / "config.json").write_text(json.dumps(config))
    assert _triples(load_model(only, include_mtp=full, include_scales=full)) == _triples(expected)
    assert _triples(load_model(only / "config.json")) == _triples(load_model(index))


def test_full_tiny_preset_and_header_only_reads(tmp_path):
    """A whole tiny preset (~221 MB) sharded over 3 files; building its spec reads only headers:
    the process's read() byte counter (/proc/self/io rchar) grows by far less than one shard."""
    spec = load_model("tiny-llama")
    index = write_checkpoint(spec, tmp_path / "tiny-llama")
    assert spec_from_safetensors_index(index).tensors == spec.tensors
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("no /proc/self/io on this platform")

    def rchar() -> int:
        return int(dict(line.split(": ") for line in io.read_text().splitlines())["rchar"])

    data = sum(f.stat().st_size for f in index.parent.glob("*.safetensors"))
    before = rchar()
    got = spec_from_safetensors_index(index)
    read = rchar() - before
    assert got.num_bytes == spec.num_bytes and data > 200_000_000
    assert read < 1_000_000, f"read {read} bytes of a {data}-byte checkpoint"


def test_header_only_on_data_less_file(tmp_path):
    """A file whose header claims 1 GiB of data stored as a sparse hole still reads fine;
    one actually cut short is reported as truncated."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [32768, 16384], "data_offsets": [0, 2 ** 30]}}).encode()
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 2 ** 30)  # sparse: nothing written, nothing to read
    assert read_safetensors_header(p) == {"w": ("bfloat16", (32768, 16384))}
    os.truncate(p, 8 + len(header) + 100)
    with pytest.raises(ModelError, match="truncated"):
        read_safetensors_header(p)


def test_single_file_checkpoint(tmp_path):
    spec = load_model("tiny-qwen3-moe", layers=1)
    d = tmp_path / "single"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(spec.config)))
    save_file({t.name: torch.zeros(t.shape, dtype=torch.bfloat16) for t in spec.tensors}, str(d / "model.safetensors"))
    assert load_model(d).tensors == spec.tensors
    assert load_model(d / "model.safetensors").tensors == spec.tensors


def test_header_dtypes_win(tmp_path):
    spec = load_model("tiny-llama", layers=1)
    index = write_checkpoint(spec, tmp_path / "c", shards=2)
    file = json.loads(index.read_text())["weight_map"]["model.norm.weight"]
    tensors = {}
    from safetensors import safe_open
    with safe_open(str(index.parent / file), framework="pt") as f:
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float()
    save_file(tensors, str(index.parent / file))
    got = spec_from_safetensors_index(index)
    assert got.tensor("model.norm.weight").dtype == "float32"
    assert got.num_bytes == spec.num_bytes + 2 * 1024


# ---- disagreements and damage ---------------------------------------------------------------------
@pytest.fixture()
def small(tmp_path):
    spec = load_model("tiny-llama", layers=1)
    return spec, write_checkpoint(spec, tmp_path / "c", shards=2)


def _rewrite_shard_of(index: Path, name: str, change) -> None:
    file = json.loads(index.read_text())["weight_map"][name]
    from safetensors.torch import load_file
    tensors = load_file(str(index.parent / file))
    change(tensors)
    save_file(tensors, str(index.parent / file))


def test_shape_disagreement(small):
    _spec, index = small
    _rewrite_shard_of(index, "model.layers.0.self_attn.k_proj.weight",
                      lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(512, 1024)}))
    with pytest.raises(ModelError, match=r"1 shape\(s\) disagree.*k_proj.weight \[512, 1024\] \(config gives \[256, 1024\]\)"):
        spec_from_safetensors_index(index)


def test_missing_and_extra_tensors(small):
    _spec, index = small
    idx = json.loads(index.read_text())
    file = idx["weight_map"].pop("model.layers.0.mlp.up_proj.weight")
    idx["weight_map"]["model.layers.0.mlp.bogus.weight"] = file
    index.write_text(json.dumps(idx))
    _rewrite_shard_of(index, "model.layers.0.mlp.bogus.weight", lambda t: t.update(
        {"model.layers.0.mlp.bogus.weight": t.pop("model.layers.0.mlp.up_proj.weight")}))
    with pytest.raises(ModelError) as e:
        spec_from_safetensors_index(index)
    msg = str(e.value)
    assert "missing: model.layers.0.mlp.up_proj.weight" in msg and "not explain: model.layers.0.mlp.bogus.weight" in msg


def test_index_and_header_disagree(small):
    _spec, index = small
    idx = json.loads(index.read_text())
    files = sorted(set(idx["weight_map"].values()))
    idx["weight_map"]["model.norm.weight"] = next(f for f in files if f != idx["weight_map"]["model.norm.weight"])
    index.write_text(json.dumps(idx))
    with pytest.raises(ModelError, match="whose header lacks it"):
        spec_from_safetensors_index(index)


def test_damaged_files(small):
    _spec, index = small
    idx = json.loads(index.read_text())
    with pytest.raises(ModelError, match="key 'weight_map'"):
        index.write_text(json.dumps({"metadata": {}}))
        spec_from_safetensors_index(index)
    index.write_text(json.dumps(idx))
    shard = index.parent / idx["weight_map"]["lm_head.weight"]
    shard.write_bytes(b"\xff" * 16)
    with pytest.raises(ModelError, match=f"{shard}: not a safetensors file"):
        spec_from_safetensors_index(index)
    shard.unlink()
    with pytest.raises(ModelError, match=f"{shard}: no such file"):
        spec_from_safetensors_index(index)
    (index.parent / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json next to it"):
        spec_from_safetensors_index(index)
