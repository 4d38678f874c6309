"""Layer normalisation written out in primitives -> ai.onnx ``LayerNormalization`` (opset 17).

The core chain is ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over the trailing
axes. It becomes ``LayerNormalization(x, ones)``; the follow-up rules then absorb a
constant ``* gamma`` and ``+ beta`` into the op's scale and bias inputs. ReduceMean's axes
may be an attribute (opset < 18) or an input (opset >= 18).
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    const_array,
    float_attr,
    int_attr,
    new_initializer,
    rank,
    scalar,
)


def _reduced_axes(node) -> list[int] | None:
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = const_array(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    return None


def _trailing_axis(node, x_rank: int | None) -> int | None:
    """The LayerNormalization ``axis`` if ``node`` reduces the trailing axes with keepdims."""
    axes = _reduced_axes(node)
    if not axes or not int_attr(node, "keepdims", 1) or int_attr(node, "noop_with_empty_axes", 0):
        return None
    from_end = []
    for a in axes:
        if a >= 0:
            if x_rank is None:
                return None
            a -= x_rank
        from_end.append(a)
    return -len(axes) if sorted(from_end) == list(range(-len(axes), 0)) else None


def _normalize(op, x, two, eps):
    mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
    centred = op.Sub(x, mean)
    square = pattern.OrValue([op.Pow(centred, two), op.Mul(centred, centred)])
    var = op.ReduceMean(square, _allow_other_inputs=True, _outputs=["var"])
    return op.Div(centred, op.Sqrt(op.Add(var, eps)))


def _layer_norm(op, x, two, eps, mean, var):
    axis = _trailing_axis(mean.producer(), rank(x))
    if axis is None or _trailing_axis(var.producer(), rank(mean)) != axis:
        return None
    if two is not None and scalar(two) != 2.0:
        return None
    epsilon = scalar(eps)
    if epsilon is None or x.dtype is None or not x.dtype.is_floating_point():
        return None
    if x.shape is None or any(not isinstance(d, int) for d in x.shape[axis:]):
        return None  # the scale input needs the normalised shape
    ones = np.ones(tuple(x.shape[axis:]), dtype=x.dtype.numpy())
    scale = new_initializer(op, ones, var, "ln_scale")
    return op.LayerNormalization(x, scale, axis=axis, epsilon=epsilon)


def _ln_times(op, x, scale, gamma):
    return op.Mul(op.LayerNormalization(x, scale, _allow_other_inputs=True, _outputs=["ln_out"]), gamma)


def _ln_plus(op, x, scale, beta):
    return op.Add(op.LayerNormalization(x, scale, _allow_other_inputs=True, _outputs=["ln_out"]), beta)


def _affine_operand(ln_node, value) -> np.ndarray | None:
    """``value`` as an array of the normalised shape, if it only spans the normalised axes."""
    array = const_array(value)
    x = ln_node.inputs[0]  # the output has x's shape
    if array is None or x.shape is None or array.ndim > len(x.shape):
        return None
    norm_shape = tuple(x.shape[int_attr(ln_node, "axis", -1):])
    if not all(isinstance(d, int) for d in norm_shape):
        return None
    extra = array.ndim - len(norm_shape)
    if extra > 0:
        if any(d != 1 for d in array.shape[:extra]):
            return None  # varies along a non-normalised axis
        array = array.reshape(array.shape[extra:])
    try:
        return np.broadcast_to(array, norm_shape).copy()
    except ValueError:
        return None


def _absorb_scale(op, x, scale, gamma, ln_out):
    node = ln_out.producer()
    if len(node.outputs) > 1:
        return None
    g = _affine_operand(node, gamma)
    s = const_array(scale)
    if g is None or s is None:
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    new_scale = new_initializer(op, (s * g).astype(s.dtype), ln_out, "ln_gamma")
    inputs = [x, new_scale]
    if bias is not None:
        b = const_array(bias)
        if b is None:
            return None
        inputs.append(new_initializer(op, (b * g).astype(s.dtype), ln_out, "ln_beta"))
    return op.LayerNormalization(*inputs, axis=int_attr(node, "axis", -1), epsilon=float_attr(node, "epsilon", 1e-5))


def _absorb_bias(op, x, scale, beta, ln_out):
    node = ln_out.producer()
    if len(node.outputs) > 1:
        return None
    b = _affine_operand(node, beta)
    if b is None:
        return None
    old = node.inputs[2] if len(node.inputs) > 2 else None
    if old is not None:
        old_b = const_array(old)
        if old_b is None:
            return None
        b = old_b + b
    new_bias = new_initializer(op, b, ln_out, "ln_beta")
    return op.LayerNormalization(x, scale, new_bias, axis=int_attr(node, "axis", -1), epsilon=float_attr(node, "epsilon", 1e-5))


def rules() -> list[pattern.RewriteRule]:
    return [
        pattern.RewriteRule(_normalize, _layer_norm, name="layer_norm"),
        pattern.RewriteRule(_ln_times, _absorb_scale, name="layer_norm_scale"),
        pattern.RewriteRule(_ln_plus, _absorb_bias, name="layer_norm_bias"),
    ]
