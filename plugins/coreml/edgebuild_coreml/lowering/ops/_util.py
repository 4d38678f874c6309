"""Small helpers shared by the op-family modules (dtypes, shapes, constants)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.var import Var

# ONNX element type -> the MIL dtype a Core ML program computes it in.
_MIL_DTYPES = {
    ir.DataType.FLOAT: "fp32",
    ir.DataType.DOUBLE: "fp32",
    ir.DataType.FLOAT16: "fp16",
    ir.DataType.BFLOAT16: "fp32",
    ir.DataType.INT64: "int32",
    ir.DataType.INT32: "int32",
    ir.DataType.INT16: "int32",
    ir.DataType.INT8: "int32",
    ir.DataType.UINT64: "int32",
    ir.DataType.UINT32: "int32",
    ir.DataType.UINT16: "int32",
    ir.DataType.UINT8: "int32",
    ir.DataType.INT4: "int32",
    ir.DataType.UINT4: "int32",
    ir.DataType.INT2: "int32",
    ir.DataType.UINT2: "int32",
    ir.DataType.BOOL: "bool",
}
_NUMPY_OF = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}


def mil_dtype(onnx_dtype: int | ir.DataType) -> str | None:
    """The MIL dtype string for an ONNX element type, or None if Core ML has none."""
    return _MIL_DTYPES.get(ir.DataType(onnx_dtype))


def numpy_dtype(mil: str):
    return _NUMPY_OF[mil]


def dtype_of(x) -> str:
    """MIL dtype string of a Var or numpy constant."""
    if isinstance(x, Var):
        return types.builtin_to_string(x.dtype)
    kind = np.asarray(x).dtype
    if kind == np.bool_:
        return "bool"
    if kind.kind in "iu":
        return "int32"
    return "fp16" if kind == np.float16 else "fp32"


def is_const(x) -> bool:
    return not isinstance(x, Var) or x.val is not None


def value_of(x) -> np.ndarray:
    return np.asarray(x.val if isinstance(x, Var) else x)


def shape_of(x) -> tuple:
    """Static shape: ints, or symbols for unknown dims."""
    return tuple(x.shape) if isinstance(x, Var) else np.shape(x)


def rank_of(x) -> int:
    return len(shape_of(x))


def is_static(dim) -> bool:
    return isinstance(dim, (int, np.integer))


def empty_of(shape, like):
    """A constant with no elements of ``like``'s dtype when ``shape`` is static with a 0 dim, else
    None. Core ML holds no zero-size tensors (MIL's tile and slice refuse them); ONNX allows them
    (an empty window slice), and nothing reads their elements, so they stay constants."""
    if not all(is_static(d) for d in shape) or 0 not in tuple(shape):
        return None
    return np.zeros(tuple(int(d) for d in shape), dtype=_NUMPY_OF[dtype_of(like)])


def const_like(value, like) -> np.ndarray:
    """``value`` as a numpy constant of ``like``'s MIL dtype (so binary ops type-check)."""
    return np.asarray(value, dtype=_NUMPY_OF[dtype_of(like)])


def dim(x, axis: int, name: str | None = None):
    """One dimension of ``x`` as an int32 scalar: a constant when static, else shape+gather."""
    size = shape_of(x)[axis]
    if is_static(size):
        return np.int32(size)
    kwargs = {"name": name} if name else {}
    return mb.gather(x=mb.shape(x=x), indices=np.int32(axis % rank_of(x)), axis=0, **kwargs)


def shape_tensor(x):
    """The shape of ``x`` as an int32 vector (a constant when fully static)."""
    shape = shape_of(x)
    if all(is_static(d) for d in shape):
        return np.array(shape, dtype=np.int32)
    return mb.shape(x=x)


def to_var(x):
    return x if isinstance(x, Var) else mb.const(val=x)


def normalize_axis(ctx, node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        ctx.fail(node, f"axis {axis} is out of range for a rank-{rank} input")
    return axis % rank if rank else 0


def axes_attribute(ctx, node) -> list[int] | None:
    """The ``axes`` attribute (Squeeze, Unsqueeze and the reductions in their older opsets)."""
    return _int_list(ctx.attr(node, "axes"))


def axes_input(ctx, node, index: int = 1) -> list[int] | None:
    """The optional constant ``axes`` input that replaced the attribute in newer opsets."""
    return _int_list(ctx.const(node, index, optional=True, what="axes"))


def _int_list(values) -> list[int] | None:
    return None if values is None else [int(a) for a in np.asarray(values).reshape(-1)]


def wanted(value) -> bool:
    """Whether an (optional) ONNX output is consumed: by a node or as a graph output."""
    return value is not None and value.name != "" and (bool(value.uses()) or value.is_graph_output())


def _cover_cond_shape(cond, a, b):
    """``a`` broadcast so that (a, b) span cond's shape: MIL's select infers its output shape
    from a and b alone, so a larger cond would be cut down to their shape."""
    shapes = [shape_of(v) for v in (cond, a, b)]
    if all(is_static(d) for shape in shapes for d in shape):
        full = np.broadcast_shapes(*shapes)
        if np.broadcast_shapes(shapes[1], shapes[2]) == full:
            return a
        if is_const(a):
            return np.broadcast_to(value_of(a), full).astype(numpy_dtype(dtype_of(a)))
    elif len(shapes[0]) <= max(len(shapes[1]), len(shapes[2])):
        return a
    if dtype_of(a) == "bool":
        return mb.logical_or(x=a, y=mb.logical_and(x=cond, y=False))
    zeros = mb.mul(x=mb.cast(x=cond, dtype=dtype_of(a)), y=const_like(0, a))
    return mb.add(x=a, y=zeros)


def select(cond, a, b, **kwargs):
    """``mb.select`` with ONNX Where's broadcasting over all three operands."""
    return mb.select(cond=cond, a=_cover_cond_shape(cond, a, b), b=b, **kwargs)
