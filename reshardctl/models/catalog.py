"""Presets and :func:`load_model`: one entry point for a name, a directory or a file."""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path

from reshardctl.errors import ModelError
from reshardctl.models.checkpoint import read_json, spec_from_safetensors_file, spec_from_safetensors_index
from reshardctl.models.config import model_dtype, spec_from_config
from reshardctl.models.spec import ModelSpec
from reshardctl.models.views import select_view, truncate

# Published configs (reshardctl/data/models/<preset>/config.json), then small shape-faithful ones.
PRESETS: tuple[str, ...] = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "tiny-llama",
    "tiny-qwen3-moe",
    "tiny-deepseek",
    # engineer "archs1": Qwen2.5 dense, Qwen2-MoE, Mixtral (published configs), then their tiny versions
    "qwen2.5-7b",
    "qwen2.5-72b",
    "qwen2-57b-a14b",
    "mixtral-8x7b",
    "tiny-qwen2-moe",
    "tiny-mixtral",
    # archs2: GLM-4.5 MoE (zai-org/GLM-4.5, GLM-4.5-Air) and gpt-oss (openai/gpt-oss-20b, -120b: the BF16 form)
    "glm-4.5",
    "glm-4.5-air",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "tiny-glm-4.5",
    "tiny-gpt-oss",
)
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def preset_config(name: str) -> dict:
    """The shipped config.json of a preset."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"unknown model preset {name!r}{hint} (presets: {', '.join(PRESETS)})")
    with resources.as_file(resources.files("reshardctl") / "data" / "models" / name / "config.json") as p:
        return read_json(p)


@lru_cache(maxsize=16)
def _preset_view(name: str, mtp: bool, scales: bool) -> ModelSpec:
    """A preset in the asked view, built directly from its config (not cut out of the full checkpoint
    view: DeepSeek-V3 without scales is half the tensors); immutable, cached. ``select_view`` drops
    nothing here, it only refuses MTP layers / scales the preset lacks (asked for neither: nothing to check)."""
    config = preset_config(name)
    model = spec_from_config(config, name, source=f"preset:{name}", include_mtp=mtp, include_scales=scales)
    return select_view(model, mtp=mtp, scales=scales, dtype=model_dtype(config, model.source)) if mtp or scales else model


def _full_from_path(path: Path) -> ModelSpec:
    if path.is_dir():
        for candidate in (INDEX_NAME, SINGLE_NAME, "config.json"):
            if (path / candidate).is_file():
                return _full_from_path(path / candidate)
        raise ModelError(f"{path}: no {INDEX_NAME}, {SINGLE_NAME} or config.json in this directory")
    if not path.exists():
        close = difflib.get_close_matches(str(path), PRESETS, n=1, cutoff=0.6)
        hint = f"; did you mean the preset {close[0]!r}?" if close else ""
        raise ModelError(f"{path}: no such file or directory, and not a preset{hint} (presets: {', '.join(PRESETS)})")
    if path.name.endswith(".index.json"):
        return spec_from_safetensors_index(path)
    if path.suffix == ".safetensors":
        return spec_from_safetensors_file(path)
    if path.suffix == ".json":
        config = read_json(path)
        return spec_from_config(
            config, path.resolve().parent.name, source=str(path), include_mtp=True, include_scales=True
        )
    raise ModelError(f"{path}: expected a config.json, a {INDEX_NAME} or a .safetensors file")


def load_model(
    spec: str | os.PathLike,
    *,
    layers: int | None = None,
    include_mtp: bool = False,
    include_scales: bool = False,
) -> ModelSpec:
    """A preset name, a directory (index and/or config.json), a config.json, an index.json or a
    single .safetensors file -> ModelSpec.

    The same view for every source: by default the training view (no MTP layers, fp8 weights as the
    model dtype, no scales). ``include_mtp`` / ``include_scales`` add DeepSeek MTP layers / the fp8
    ``weight_scale_inv`` tensors (checkpoint view) and are a ModelError where the model has none.
    For a checkpoint, names/shapes/dtypes are those of the shard headers. ``layers``: :func:`truncate`.
    """
    if isinstance(spec, str) and not spec.strip():
        raise ModelError(f"model {spec!r}: empty; give a preset ({', '.join(PRESETS)}) or a path")
    if isinstance(spec, str) and spec in PRESETS:
        model = _preset_view(spec, bool(include_mtp), bool(include_scales))
    else:
        full = _full_from_path(Path(spec))
        model = select_view(full, mtp=include_mtp, scales=include_scales, dtype=model_dtype(full.config, full.source))
    if layers is not None:
        model = truncate(model, layers)
    return model
