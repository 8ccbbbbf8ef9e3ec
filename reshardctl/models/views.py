"""Derived views of a :class:`ModelSpec`: the first N layers, with or without MTP / fp8 scales."""

from __future__ import annotations

from dataclasses import replace

from reshardctl.errors import ModelError
from reshardctl.models.spec import ModelSpec, TensorSpec

_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _rebuild(model: ModelSpec, tensors: list[TensorSpec], *, name: str | None = None, config=None, **dims) -> ModelSpec:
    return replace(
        model, name=name or model.name, tensors=tuple(tensors), dims=replace(model.dims, **dims),
        config=model.config if config is None else config,
    )


def truncate(model: ModelSpec, layers: int) -> ModelSpec:
    """The first ``layers`` decoder layers plus embeddings, final norm and lm_head (MTP dropped).

    ``dims.num_layers`` / ``moe_layers`` / ``num_mtp_layers`` and the config's ``num_hidden_layers``
    follow, so ``spec_from_config(truncate(m, n).config, ...)`` describes the same tensors.
    """
    total = model.dims.num_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= total:
        raise ModelError(f"model {model.name}: --layers must be between 1 and {total}, got {layers!r}")
    if layers == total and not model.dims.num_mtp_layers:
        return model
    kept = [t for t in model.tensors if t.layer is None or t.layer < layers]
    config = dict(model.config)
    if "num_hidden_layers" in config:
        config["num_hidden_layers"] = layers
    return _rebuild(
        model, kept,
        name=model.name if layers == total else f"{model.name}-{layers}L",
        num_layers=layers,
        moe_layers=tuple(l for l in model.dims.moe_layers if l < layers),
        num_mtp_layers=0,
        config=config,
    )


def drop_mtp(model: ModelSpec) -> ModelSpec:
    """The main model without MTP layers (identity when there are none)."""
    if not model.dims.num_mtp_layers:
        return model
    return truncate(model, model.dims.num_layers)


def drop_scales(model: ModelSpec, dtype: str) -> ModelSpec:
    """The training view of an fp8 checkpoint: no ``weight_scale_inv``, fp8 weights as ``dtype``."""
    if not any(t.kind == "scale_inv" for t in model.tensors):
        return model
    kept = [  # the constructor, not dataclasses.replace (several times slower over ~45k tensors)
        TensorSpec(t.name, t.shape, dtype, t.role, t.kind, t.layer, t.expert, t.scale_of) if t.dtype in _FP8 else t
        for t in model.tensors
        if t.kind != "scale_inv"
    ]
    return _rebuild(model, kept)


def select_view(model: ModelSpec, *, mtp: bool, scales: bool, dtype: str = "bfloat16") -> ModelSpec:
    """Keep or drop MTP layers and fp8 scales; asking for ones the model lacks is a ModelError."""
    if mtp and not model.dims.num_mtp_layers:
        raise ModelError(f"model {model.name} ({model.source or 'no source'}): no MTP layers to include")
    if scales and not any(t.kind == "scale_inv" for t in model.tensors):
        raise ModelError(f"model {model.name} ({model.source or 'no source'}): no fp8 scale tensors to include")
    if not mtp:
        model = drop_mtp(model)
    if not scales:
        model = drop_scales(model, dtype)
    return model
