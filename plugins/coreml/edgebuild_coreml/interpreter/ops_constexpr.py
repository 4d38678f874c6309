"""constexpr_* ops: weights stored compressed (quantised, palettised, sparse, cast).

The op classes carry exact static ``decompress`` functions; they are called with the
evaluated inputs, so a chain of constexpr ops (e.g. lut_to_sparse -> sparse_to_dense) works.
The iOS16 and iOS18 forms of an op share a name and differ in parameters.
"""

from __future__ import annotations

import numpy as np

from .registry import evaluates


def _optional(x, name):
    value = x.get(name)
    return None if value is None else np.asarray(value)


@evaluates("constexpr_affine_dequantize")
def affine_dequantize(op, x):
    # coremltools' decompress computes the same in float32, but ends in a copy, so two dense
    # arrays exist at once: for an int8 embedding table, twice its float size. One here.
    from coremltools.optimize._utils import promote_rank_to_same_as_data

    data, axis = np.asarray(x["quantized_data"]), int(x["axis"])
    zero_point, scale = (promote_rank_to_same_as_data(np.asarray(x[k]), data, axis) for k in ("zero_point", "scale"))
    out = data.astype(np.float32)
    out -= zero_point.astype(np.float32)
    out *= scale
    return out.astype(scale.dtype, copy=False)


@evaluates("constexpr_cast")
def constexpr_cast(op, x):
    from coremltools.converters.mil.mil import types

    return np.asarray(x["source_val"]).astype(types.string_to_nptype(str(x["output_dtype"])))


@evaluates("constexpr_lut_to_dense")
def lut_to_dense(op, x):
    lut, indices = np.asarray(x["lut"]), np.asarray(x["indices"])
    if "shape" in x:  # iOS16: flat packed indices and an explicit shape
        return type(op).decompress(lut, indices, np.asarray(x["shape"]))
    return type(op).decompress(indices, lut, _optional(x, "vector_axis"))


@evaluates("constexpr_sparse_to_dense")
def sparse_to_dense(op, x):
    nonzero_data, mask = np.asarray(x["nonzero_data"]), np.asarray(x["mask"])
    if "shape" in x:  # iOS16: bit-packed flat mask and an explicit shape
        return type(op).decompress(nonzero_data, mask, np.asarray(x["shape"]))
    return type(op).decompress(nonzero_data, mask)


@evaluates("constexpr_blockwise_shift_scale")
def blockwise_shift_scale(op, x):
    data, scale = np.asarray(x["data"]), np.asarray(x["scale"])
    return type(op).decompress(data, scale, _optional(x, "offset"))


@evaluates("constexpr_lut_to_sparse")
def lut_to_sparse(op, x):
    return type(op).decompress(
        np.asarray(x["indices_mask"]), np.asarray(x["indices_nonzero_data"]),
        np.asarray(x["lut"]), _optional(x, "vector_axis"),
    )


@evaluates("constexpr_sparse_blockwise_shift_scale")
def sparse_blockwise_shift_scale(op, x):
    return type(op).decompress(
        np.asarray(x["data_mask"]), np.asarray(x["nonzero_data"]),
        np.asarray(x["scale"]), _optional(x, "offset"),
    )
