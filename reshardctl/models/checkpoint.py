"""A safetensors checkpoint (index + shard headers) -> :class:`ModelSpec`, never reading tensor data.

Each shard is read as the format defines it (the safetensors README, "Format"): an 8-byte little-endian header length
``N``, then ``N`` bytes of JSON; nothing after that is read. The ``config.json`` next to the index
gives names, roles and dims (:func:`spec_from_config`); shapes and dtypes come from the headers and
must agree with the config-derived inventory, tensor by tensor.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import replace
from math import prod
from pathlib import Path
from typing import Any, Mapping

from reshardctl.bounded_load import LoadError, load_file, loads_json, open_regular
from reshardctl.errors import ModelError
from reshardctl.models.config import spec_from_config
from reshardctl.models.spec import DTYPE_BYTES, ModelSpec

# safetensors dtype tag -> torch dtype name (a key of DTYPE_BYTES)
SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
MAX_JSON_BYTES = 64 << 20  # config.json / model.safetensors.index.json (DeepSeek-V3's index: ~9 MB)
MAX_HEADER_DIM = 1 << 40  # one dim of a header shape (products are checked against the file size too)
# Non-parameter buffers some old checkpoints carry; not part of the exchange space.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file (config.json, an index) within the bounds of ``reshardctl.bounded_load``
    (at most ``MAX_JSON_BYTES``); ModelError naming the file otherwise."""
    try:
        data = load_file(path, "json", max_bytes=MAX_JSON_BYTES)
    except LoadError as exc:
        raise ModelError(f"{path}: {'cannot read: ' if exc.reading and 'no such' not in str(exc) else ''}{exc}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 8:
        raise ValueError(f"shape must be a list of at most 8 dims, got {str(value)[:60]}")
    for s in value:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_HEADER_DIM:
            raise ValueError(f"shape {str(value)[:60]}: each dim must be an integer between 0 and {MAX_HEADER_DIM}")
    return tuple(value)


def _offsets(value: Any) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2 or not all(
            isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 1 << 62 for o in value):
        raise ValueError(f"data_offsets must be [begin, end] (integers >= 0), got {str(value)[:60]}")
    return value[0], value[1]


def read_safetensors_header(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (torch dtype, shape)}`` of one .safetensors file, reading only its header bytes."""
    try:
        fd = open_regular(path)
    except LoadError as exc:
        raise ModelError(f"{path}: {exc}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ModelError(f"{path}: not a safetensors file (header length {n}, file size {size})")
            raw = f.read(n)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read: {exc}") from None
    try:
        header = loads_json(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except ValueError as exc:
        raise ModelError(f"{path}: bad safetensors header: {exc}") from None
    data_size = size - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            if not isinstance(entry, dict):
                raise ValueError(f"expected a mapping, got {type(entry).__name__}")
            tag = entry.get("dtype")
            if not isinstance(tag, str) or tag not in SAFETENSORS_DTYPES:
                raise ValueError(f"dtype must be one of {', '.join(SAFETENSORS_DTYPES)}, got {str(tag)[:40]}")
            dtype = SAFETENSORS_DTYPES[tag]
            shape = _shape(entry.get("shape"))
            begin, end = _offsets(entry.get("data_offsets"))
        except ValueError as exc:
            raise ModelError(f"{path}: bad header entry for {name[:200]!r}: {exc}") from None
        if end - begin != prod(shape) * DTYPE_BYTES[dtype] or begin < 0:
            raise ModelError(f"{path}: {name}: data_offsets {begin}..{end} do not hold {dtype}{list(shape)}")
        if end > data_size:
            raise ModelError(f"{path}: truncated: {name} ends at byte {end} of a {data_size}-byte data section")
        out[name] = (dtype, shape)
        spans.append((begin, end, name))
    _check_disjoint(path, spans)
    return out


def _check_disjoint(path: str | os.PathLike, spans: list[tuple[int, int, str]]) -> None:
    """Each tensor's bytes are its own: sorted by offset, no two ``data_offsets`` ranges overlap (two
    tensors sharing bytes would pass every shape check and only fail inside the ranks)."""
    prev_end, prev_name = 0, None
    for begin, end, name in sorted(spans):
        if begin < prev_end and end > begin:
            raise ModelError(f"{path}: {name[:200]} (data_offsets {begin}..{end}) overlaps {prev_name[:200]} "
                             f"(which ends at byte {prev_end}): every tensor needs bytes of its own")
        if end > prev_end:
            prev_end, prev_name = end, name


def _shard_headers(weight_map: Mapping[str, str], base: Path, where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    by_file: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise ModelError(f"{where}: key 'weight_map.{name}' must be a file name, got {file!r}")
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        header = read_safetensors_header(base / file)
        for name in names:
            if name not in header:
                raise ModelError(f"{where}: weight_map puts {name} in {file}, whose header lacks it")
            found[name] = header[name]
        stray = sorted(set(header) - set(names))
        if stray:
            raise ModelError(f"{where}: {file} holds {len(stray)} tensor(s) not in weight_map, e.g. {stray[0]}")
    return found


def _sample(names: set[str], k: int = 5) -> str:
    items = sorted(names)
    return ", ".join(items[:k]) + (f" (+{len(items) - k} more)" if len(items) > k else "")


def spec_from_checkpoint(
    weight_map: Mapping[str, str], base: Path, *, where: str, name: str | None = None
) -> ModelSpec:
    """The checkpoint view (MTP and fp8 scales as present) of shards named by ``weight_map``."""
    config_path = base / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{where}: no config.json next to it ({config_path}); it gives names, roles and dims")
    config = read_json(config_path)
    found = {k: v for k, v in _shard_headers(weight_map, base, where).items() if not _IGNORED.search(k)}
    num_layers = config.get("num_hidden_layers")
    has_mtp = isinstance(num_layers, int) and any(
        (m := _LAYER.match(k)) and int(m.group(1)) >= num_layers for k in found
    )
    has_scales = any(k.endswith(".weight_scale_inv") for k in found)
    expected = spec_from_config(
        config, name or base.resolve().name, source=where, include_mtp=has_mtp, include_scales=has_scales
    )
    want = {t.name for t in expected.tensors}
    missing, extra = want - set(found), set(found) - want
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) the config implies are missing: {_sample(missing)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) the config does not explain: {_sample(extra)}")
    bad = [
        f"{t.name} {list(found[t.name][1])} (config gives {list(t.shape)})"
        for t in expected.tensors if t.name in found and found[t.name][1] != t.shape
    ]
    if bad:
        problems.append(f"{len(bad)} shape(s) disagree with {config_path}: " + "; ".join(bad[:5]))
    if problems:
        raise ModelError(f"{where}: checkpoint does not match {config_path}:\n  " + "\n  ".join(problems))
    tensors = tuple(replace(t, dtype=found[t.name][0]) for t in expected.tensors)
    return replace(expected, tensors=tensors)


def spec_from_safetensors_index(path: str | os.PathLike) -> ModelSpec:
    """``model.safetensors.index.json`` (+ shard headers + the config.json beside it) -> ModelSpec.

    The checkpoint view: MTP layers and ``weight_scale_inv`` tensors are included when the checkpoint
    holds them, dtypes are those of the headers. ``metadata.total_size`` is not trusted (published
    indexes are not always exact); the headers are checked tensor by tensor instead.
    """
    path = Path(path)
    index = read_json(path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelError(f"{path}: key 'weight_map' is missing or empty")
    return spec_from_checkpoint(weight_map, path.parent, where=str(path))


def spec_from_safetensors_file(path: str | os.PathLike) -> ModelSpec:
    """A single-file checkpoint (``model.safetensors`` + config.json beside it) -> ModelSpec."""
    path = Path(path)
    names = read_safetensors_header(path)
    return spec_from_checkpoint(dict.fromkeys(names, path.name), path.parent, where=str(path))
