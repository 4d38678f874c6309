"""EyeLike: a constant identity-like matrix (ones on diagonal ``k``), from a static shape."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild_coreml.lowering.ops._util import is_static, shape_of
from edgebuild_coreml.lowering.registry import lowers


@lowers("EyeLike", since=9)
def eye_like(ctx, node):
    shape = shape_of(ctx.input(node, 0))
    if len(shape) != 2 or not all(is_static(d) for d in shape):
        ctx.fail(node, "needs a rank-2 input with a static shape", hint="pin the input shapes in the recipe")
    dtype = ctx.attr(node, "dtype")
    onnx_dtype = ir.DataType(dtype) if dtype is not None else node.inputs[0].dtype
    numpy_dtype = onnx_dtype.numpy() if onnx_dtype is not None else np.float32
    return np.eye(int(shape[0]), int(shape[1]), k=int(ctx.attr(node, "k", 0)), dtype=numpy_dtype)
