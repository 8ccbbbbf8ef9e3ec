"""Model catalog: exact tensor inventories (HF checkpoint names, shapes, dtypes, roles)."""

from reshardctl.models.spec import DTYPE_BYTES, ModelDims, ModelSpec, TensorSpec
from reshardctl.models.catalog import PRESETS, load_model  # noqa: E402
from reshardctl.models.checkpoint import spec_from_safetensors_index  # noqa: E402
from reshardctl.models.config import spec_from_config  # noqa: E402
from reshardctl.models.views import truncate  # noqa: E402

__all__ = [
    "DTYPE_BYTES", "ModelDims", "ModelSpec", "TensorSpec",
    "PRESETS", "load_model", "spec_from_config", "spec_from_safetensors_index", "truncate",
]
