"""What Loop and Scan share: a loop body's outputs pinned to their declared shapes, and the
preallocated buffers that gather one row per iteration (MIL loops carry fixed-type variables,
so a scan output is a buffer of known row shape written with ``scatter``)."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.types.symbolic import is_symbolic
from coremltools.converters.mil.mil.var import Var

_ZEROS = {types.fp32: np.float32(0), types.fp16: np.float16(0), types.int32: np.int32(0), types.bool: np.bool_(False)}


def pin_declared_shapes(ctx, node, body, outputs):
    """Body outputs whose shape MIL cannot infer (a Slice at the iteration number) reshaped to
    the static shape the ONNX body declares for them: a while_loop variable must keep its
    type, and a row buffer is preallocated from the row shape."""
    pinned = []
    for k, (value, out) in enumerate(zip(body.outputs, outputs)):
        declared = value.shape
        if (isinstance(out, Var) and declared is not None and types.is_tensor(out.sym_type)
                and len(declared) == out.rank and any(is_symbolic(d) for d in out.shape)
                and all(isinstance(d, int) for d in declared)):
            out = mb.reshape(x=out, shape=np.array(list(declared), np.int32), name=ctx.name(node, f"declared{k}"))
        pinned.append(out)
    return pinned


def check_row_types(ctx, node, row_types) -> None:
    """Refuse rows a buffer cannot be preallocated for: unknown shapes, types MIL cannot fill."""
    for k, (dtype, shape) in enumerate(row_types):
        if any(is_symbolic(d) for d in shape):
            ctx.fail(node, f"scan output {k} has rows of shape {tuple(shape)}, not known when the model is built; "
                     "the buffer that gathers them must be preallocated", "pin the input shapes in the recipe")
        if dtype not in _ZEROS:
            ctx.fail(node, f"scan output {k} is {types.builtin_to_string(dtype)}; buffers hold fp32, fp16, int32 or bool")


def row_buffer(ctx, node, length, row_type, k):
    """Zeros of shape [length, *row shape]; ``length`` is an int or an int32 scalar Var."""
    dtype, shape = row_type
    row = np.array([int(d) for d in shape], np.int32)
    if isinstance(length, Var):
        parts = [mb.reshape(x=length, shape=[1], name=ctx.name(node, f"length_1d{k}"))] + ([row] if row.size else [])
        full = mb.concat(values=parts, axis=0, name=ctx.name(node, f"buffer_shape{k}")) if len(parts) > 1 else parts[0]
    else:
        full = np.concatenate([[np.int32(length)], row]).astype(np.int32)
    if dtype == types.bool:  # fill makes no bool tensors
        zeros = mb.fill(shape=full, value=np.int32(0), name=ctx.name(node, f"buffer_i{k}"))
        return mb.cast(x=zeros, dtype="bool", name=ctx.name(node, f"buffer{k}"))
    return mb.fill(shape=full, value=_ZEROS[dtype], name=ctx.name(node, f"buffer{k}"))


def write_row(ctx, node, buffer, i, row, k):
    """``buffer[i] = row``."""
    index = mb.reshape(x=i, shape=[1], name=ctx.name(node, f"row_index{k}"))
    update = mb.expand_dims(x=row, axes=[0], name=ctx.name(node, f"row{k}"))
    return mb.scatter(data=buffer, indices=index, updates=update, axis=0, mode="update",
                      name=ctx.name(node, f"gathered{k}"))
