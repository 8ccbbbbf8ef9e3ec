"""Model catalog: exact tensor inventories (HF checkpoint names, shapes, dtypes, roles)."""

from reshardctl.models.spec import DTYPE_BYTES, ModelDims, ModelSpec, TensorSpec

__all__ = ["DTYPE_BYTES", "ModelDims", "ModelSpec", "TensorSpec"]
