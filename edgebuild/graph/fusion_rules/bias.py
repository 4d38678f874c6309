"""Bias folding: Conv + Add -> Conv(bias), and linear layers -> ``edgebuild::Linear``.

Linear layers reach us as Gemm, as MatMul with a constant 2-D weight, or as either followed
by an Add of a bias vector. They all become ``Linear(X, W, B?)`` with ``W`` in ``[in, out]``
layout, so a backend lowers one op instead of four shapes of the same thing. The rules
compose: MatMul -> Linear first, then Linear + Add -> Linear with bias.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    const_array,
    float_attr,
    int_attr,
    new_initializer,
    rank,
    static_dim,
)


def _bias_vector(value, channels: int | None, axis_from_end: int, out_rank: int | None):
    """``value`` as a 1-D [channels] vector if, broadcast onto the output, it varies only
    along the channel axis (``axis_from_end`` 1 for a Linear's last axis, 3 for NCHW Conv's
    C axis, ...). A bias with more dims than the output would change its rank: refused."""
    array = const_array(value)
    if array is None or channels is None or (out_rank is not None and array.ndim > out_rank):
        return None
    if array.size == 1:
        return np.full(channels, array.reshape(()), dtype=array.dtype)
    padded = (1,) * max(axis_from_end - array.ndim, 0) + tuple(array.shape)
    channel_index = len(padded) - axis_from_end
    others = [d for i, d in enumerate(padded) if i != channel_index]
    if padded[channel_index] != channels or any(d != 1 for d in others):
        return None
    return array.reshape(channels)


def is_weight(value) -> bool:
    """A constant, the dequantised form of one (weights kept compressed), or a 2-D one read
    transposed (``x @ W.T`` with ``W`` stored once, as nn.Linear holds it)."""
    if const_array(value) is not None:
        return True
    producer = value.producer() if value is not None else None
    if producer is None or producer.domain not in ("", "ai.onnx") or const_array(producer.inputs[0]) is None:
        return False
    if producer.op_type == "DequantizeLinear":
        return True
    perm = producer.attributes.get("perm")
    return producer.op_type == "Transpose" and rank(producer.inputs[0]) == 2 and (
        perm is None or list(perm.as_ints()) == [1, 0])


# ---- Conv + Add ------------------------------------------------------------------------


def _conv_add(op, x, b):
    return op.Add(op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"]), b)


def _conv_with_bias(op, x, b, conv_out):
    conv = conv_out.producer()
    weight = conv.inputs[1]
    channels = static_dim(weight, 0)
    spatial = (rank(weight) or 0) - 2
    vector = _bias_vector(b, channels, spatial + 1, rank(conv_out) or (spatial + 2))
    if vector is None:
        return None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        old = const_array(conv.inputs[2])
        if old is None:
            return None
        vector = old + vector
    bias_init = new_initializer(op, vector.astype(const_array(b).dtype), conv_out, "bias")
    return op.Conv(x, weight, bias_init, **dict(conv.attributes))


# ---- linear layers -----------------------------------------------------------------------


def _matmul(op, x, w):
    return op.MatMul(x, w)


def _matmul_to_linear(op, x, w):
    if not is_weight(w) or rank(w) != 2:
        return None
    return op.Linear(x, w, _domain=EDGEBUILD_DOMAIN)


def _matmul_add(op, x, w, b):
    return op.Add(op.MatMul(x, w, _outputs=["mm_out"]), b)


def _matmul_add_to_linear(op, x, w, b, mm_out):
    if rank(w) != 2:
        return None
    vector = _bias_vector(b, static_dim(w, 1), 1, rank(mm_out))
    if vector is None:
        return None
    return op.Linear(x, w, new_initializer(op, vector, mm_out, "bias"), _domain=EDGEBUILD_DOMAIN)


def _linear_add(op, x, w, b):
    linear = op.Linear(x, w, _domain=EDGEBUILD_DOMAIN, _allow_other_inputs=True, _outputs=["lin_out"])
    return op.Add(linear, b)


def _linear_add_to_linear(op, x, w, b, lin_out):
    vector = _bias_vector(b, static_dim(w, 1), 1, rank(lin_out))
    if vector is None:
        return None
    node = lin_out.producer()
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        old = const_array(node.inputs[2])
        if old is None:
            return None
        vector = old + vector
    return op.Linear(x, w, new_initializer(op, vector, lin_out, "bias"), _domain=EDGEBUILD_DOMAIN)


def _gemm(op, a, b):
    return op.Gemm(a, b, _allow_other_inputs=True, _outputs=["gemm_out"])


def _gemm_to_linear(op, a, b, gemm_out):
    gemm = gemm_out.producer()
    if int_attr(gemm, "transA", 0) or rank(a) != 2:
        return None
    alpha, beta = float_attr(gemm, "alpha", 1.0), float_attr(gemm, "beta", 1.0)
    weight = b
    if int_attr(gemm, "transB", 0) or alpha != 1.0:
        array = const_array(b)
        if array is None:
            return None
        array = array.T if int_attr(gemm, "transB", 0) else array
        weight = new_initializer(op, (array * np.asarray(alpha, array.dtype)).astype(array.dtype), gemm_out, "weight")
    out_features = static_dim(gemm_out, 1) or static_dim(b, 0 if int_attr(gemm, "transB", 0) else 1)
    c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if c is None:
        return op.Linear(a, weight, _domain=EDGEBUILD_DOMAIN)
    vector = _bias_vector(c, out_features, 1, 2)
    if vector is None:
        return None
    vector = vector * np.asarray(beta, vector.dtype)
    return op.Linear(a, weight, new_initializer(op, vector, gemm_out, "bias"), _domain=EDGEBUILD_DOMAIN)


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_conv_add, _conv_with_bias, name="conv_add_bias"),
        pattern.RewriteRule(_gemm, _gemm_to_linear, name="gemm_linear"),
        pattern.RewriteRule(_matmul_add, _matmul_add_to_linear, name="matmul_add_linear"),
        pattern.RewriteRule(_matmul, _matmul_to_linear, name="matmul_linear"),
        pattern.RewriteRule(_linear_add, _linear_add_to_linear, name="linear_add_bias"),
    ]
