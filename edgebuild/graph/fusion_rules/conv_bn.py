"""Conv followed by inference-mode BatchNormalization -> one Conv with the BN folded in.

BN(y) = gamma * (y - mean) / sqrt(var + eps) + beta is affine per output channel, so it
scales the conv's filters by s = gamma / sqrt(var + eps) and moves its bias to
(b - mean) * s + beta. Only constant weights can be folded.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    const_array,
    float_attr,
    new_initializer,
)


def _conv_bn(op, x, gamma, beta, mean, var):
    conv = op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"])
    return op.BatchNormalization(conv, gamma, beta, mean, var, _outputs=["bn_out"])


def _folded_conv(op, x, gamma, beta, mean, var, conv_out, bn_out):
    conv, bn = conv_out.producer(), bn_out.producer()
    if any(o.uses() or o.is_graph_output() for o in bn.outputs[1:]):
        return None  # training-mode BN: its running statistics are consumed
    weight = const_array(conv.inputs[1])
    stats = [const_array(v) for v in (gamma, beta, mean, var)]
    if weight is None or any(s is None for s in stats):
        return None
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    bias = const_array(conv.inputs[2]) if has_bias else np.zeros(weight.shape[0], weight.dtype)
    if bias is None:
        return None
    g, b, m, v = (s.astype(np.float64).reshape(-1) for s in stats)
    scale = g / np.sqrt(v + float_attr(bn, "epsilon", 1e-5))
    if scale.shape[0] != weight.shape[0]:
        return None
    filters = weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    new_bias = (bias.astype(np.float64) - m) * scale + b
    w = new_initializer(op, filters.astype(weight.dtype), bn_out, "conv_weight")
    b_new = new_initializer(op, new_bias.astype(weight.dtype), bn_out, "conv_bias")
    return op.Conv(x, w, b_new, **dict(conv.attributes))


def rules() -> list[pattern.RewriteRule]:
    return [pattern.RewriteRule(_conv_bn, _folded_conv, name="fuse_conv_bn")]
