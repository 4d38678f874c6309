"""MLIR tensor types as ONNX and numpy types; unsupported element types are refused by name."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError

# MLIR element type spelling -> ONNX data type. i1 is bool; ui* are unsigned; the rest signless.
ELEMENT_TYPES = {
    "f32": ir.DataType.FLOAT, "f16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16,
    "f64": ir.DataType.DOUBLE, "i1": ir.DataType.BOOL,
    "i8": ir.DataType.INT8, "i16": ir.DataType.INT16, "i32": ir.DataType.INT32, "i64": ir.DataType.INT64,
    "ui8": ir.DataType.UINT8, "ui16": ir.DataType.UINT16, "ui32": ir.DataType.UINT32,
    "ui64": ir.DataType.UINT64,
}


def element_name(mlir_type) -> str:
    from jaxlib.mlir import ir as mlir

    return str(mlir.RankedTensorType(mlir_type).element_type) if _is_shaped(mlir_type) else str(mlir_type)


def _is_shaped(mlir_type) -> bool:
    from jaxlib.mlir import ir as mlir

    try:
        mlir.RankedTensorType(mlir_type)
    except ValueError:
        return False
    return True


# Element types whose values the converted graph carries in another type. bfloat16 has no Core ML
# tensor type and few onnxruntime kernels, so its values travel as float32 (which holds each
# exactly): arithmetic on them computes in float32, as coremltools computes a bfloat16 PyTorch
# model, and a ``convert`` to bfloat16 still rounds to it (``elementwise.convert``).
CARRIED = {"bf16": ir.DataType.FLOAT}


def onnx_dtype(mlir_type, where: str = "") -> ir.DataType:
    """The ONNX type the converted graph holds a value of ``mlir_type`` in (see CARRIED)."""
    name = element_name(mlir_type)
    if name in CARRIED:
        return CARRIED[name]
    return source_onnx_dtype(mlir_type, where)


def is_carried(mlir_type) -> bool:
    """Whether the graph holds ``mlir_type``'s values in a wider type than the module's."""
    return element_name(mlir_type) in CARRIED


def source_onnx_dtype(mlir_type, where: str = "") -> ir.DataType:
    """The module's own element type (bfloat16 as bfloat16), for JAX running the module."""
    name = element_name(mlir_type)
    found = ELEMENT_TYPES.get(name)
    if found is None:
        raise BuildError(f"{where}: element type {name} is not supported ({_why_not(name)})",
                         hint="cast the value to a float or integer type in the source")
    return found


def _why_not(name: str) -> str:
    """Why an MLIR element type has no ONNX/Core ML counterpart, for the refusal message."""
    if name.startswith("complex"):
        return "complex numbers, as jnp.fft and complex arithmetic make, have no ONNX or Core ML tensor type"
    if name.startswith("f8") or name.startswith("f4") or name.startswith("f6"):
        return "8-bit and narrower floats have no Core ML tensor type"
    if name in ("i2", "i4", "ui2", "ui4"):
        return "sub-byte integers have no Core ML tensor type; int4 weights come from the recipe's compression"
    return "it has no ONNX or Core ML counterpart"


def numpy_dtype(mlir_type, where: str = "") -> np.dtype:
    """The numpy type of the converted graph's values (see CARRIED)."""
    return onnx_dtype(mlir_type, where).numpy()


def source_dtype(mlir_type, where: str = "") -> np.dtype:
    """The numpy type of the module's own values (``ml_dtypes.bfloat16`` for bf16)."""
    return np.dtype(source_onnx_dtype(mlir_type, where).numpy())


def tensor_shape(mlir_type) -> list[int | None]:
    """Static dims as ints, dynamic ones as None; [] for a scalar (0-d) tensor."""
    from jaxlib.mlir import ir as mlir

    if not _is_shaped(mlir_type):
        return []
    shaped = mlir.RankedTensorType(mlir_type)
    return [None if shaped.is_dynamic_dim(i) else shaped.get_dim_size(i) for i in range(shaped.rank)]
