"""LSTM onto MIL's fused ``lstm`` op (forward, reverse, bidirectional; peepholes; layouts).

ONNX stacks gates as i, o, f, c; MIL as i, f, o, z(=c), so weights are re-ordered at
build time, which needs them constant. What MIL's lstm cannot express (per-sequence
lengths, coupled input/forget gates, parametric activations, gate clipping) is refused with the reason.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, static_shape
from edgebuild_coreml.lowering.registry import lowers

_ACTIVATIONS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}
_DIRECTIONS = {"forward": "forward", "reverse": "reverse", "bidirectional": "bidirectional"}


def _iofc_to_ifoc(array: np.ndarray, hidden: int) -> np.ndarray:
    i, o, f, c = (array[k * hidden:(k + 1) * hidden] for k in range(4))
    return np.concatenate([i, f, o, c])


def _weights(ctx, node, index: int, what: str) -> np.ndarray:
    value = ctx.input(node, index)
    if not isinstance(value, np.ndarray):
        ctx.fail(node, f"{what} must be a constant: MIL's lstm takes const weights", "make it an initializer")
    return value.astype(np.float32)


def _activations(ctx, node, directions: int) -> tuple[str, str, str]:
    names = [a.decode() if isinstance(a, bytes) else a for a in ctx.attr(node, "activations", [])]
    if not names:
        return "sigmoid", "tanh", "tanh"
    names = [n.lower() for n in names]
    if directions == 2 and names[:3] != names[3:6]:
        ctx.fail(node, "bidirectional LSTM with different activations per direction is not expressible in MIL")
    unknown = [n for n in names[:3] if n not in _ACTIVATIONS]
    if unknown:
        ctx.fail(node, f"activation(s) {unknown} are not available in MIL's lstm (sigmoid, tanh, relu are)")
    if ctx.attr(node, "activation_alpha") or ctx.attr(node, "activation_beta"):
        ctx.fail(node, "parametric activations (activation_alpha/beta) are not expressible in MIL's lstm")
    return tuple(_ACTIVATIONS[n] for n in names[:3])


def _initial_state(ctx, node, index, batch, directions, hidden, layout, x, tag):
    state = as_float(ctx.input(node, index, optional=True))
    if state is None:
        return np.zeros([batch, directions * hidden], float_np(x))
    if isinstance(state, np.ndarray):
        state = state if layout == 0 else state.transpose(1, 0, 2)
        return state.transpose(1, 0, 2).reshape(batch, directions * hidden).astype(float_np(x))
    if layout == 0:
        state = mb.transpose(x=state, perm=[1, 0, 2], name=ctx.name(node, tag + "_bdh"))
    return mb.reshape(x=state, shape=[batch, directions * hidden], name=ctx.name(node, tag))


@lowers("LSTM", since=7)
def lstm(ctx, node):
    x = as_float(ctx.input(node, 0))
    layout = int(ctx.attr(node, "layout", 0))
    direction = ctx.attr(node, "direction", "forward")
    direction = _DIRECTIONS[direction.decode() if isinstance(direction, bytes) else direction]
    directions = 2 if direction == "bidirectional" else 1
    hidden = int(ctx.attr(node, "hidden_size"))
    if int(ctx.attr(node, "input_forget", 0)):
        ctx.fail(node, "input_forget=1 (coupled input and forget gates) is not expressible in MIL's lstm")
    shape = static_shape(x)
    if shape is None:
        ctx.fail(node, "LSTM needs static input shapes", "pin the input shapes in the recipe")
    steps, batch = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    if ctx.has_input(node, 4):
        lengths = ctx.const(node, 4, what="sequence_lens")
        if np.any(np.asarray(lengths) != steps):
            ctx.fail(node, "sequence_lens shorter than the sequence are not expressible in MIL's lstm "
                     "(it has no per-sequence lengths)", "pad or split the batch so every sequence is full length")
    recurrent, cell, output = _activations(ctx, node, directions)

    w, r = _weights(ctx, node, 1, "W"), _weights(ctx, node, 2, "R")
    b = ctx.input(node, 3, optional=True)
    if b is not None and not isinstance(b, np.ndarray):
        ctx.fail(node, "B must be a constant: MIL's lstm takes a const bias", "make it an initializer")
    b = np.zeros([directions, 8 * hidden], np.float32) if b is None else b.astype(np.float32)
    p = ctx.input(node, 7, optional=True)
    if p is not None and not isinstance(p, np.ndarray):
        ctx.fail(node, "P must be a constant: MIL's lstm takes const peepholes", "make it an initializer")
    dtype = float_np(x)

    def direction_params(d):
        params = {
            "weight_ih": _iofc_to_ifoc(w[d], hidden).astype(dtype),
            "weight_hh": _iofc_to_ifoc(r[d], hidden).astype(dtype),
            "bias": _iofc_to_ifoc(b[d, :4 * hidden] + b[d, 4 * hidden:], hidden).astype(dtype),
        }
        if p is not None:
            i, o, f = (p[d, k * hidden:(k + 1) * hidden] for k in range(3))
            params["peephole"] = np.concatenate([i, f, o]).astype(dtype)
        return params

    kwargs = direction_params(0)
    if directions == 2:
        kwargs.update({f"{k}_back": v for k, v in direction_params(1).items()})
    if ctx.attr(node, "clip") is not None:
        ctx.fail(node, "clip is not expressible: ONNX clips every gate's pre-activation, MIL's lstm only the cell")
    sequence = x if layout == 0 else mb.transpose(x=x, perm=[1, 0, 2], name=ctx.name(node, "time_major"))
    reverse = direction == "reverse"
    if reverse:  # run forward over the reversed sequence: no doubt about MIL's output order
        sequence = mb.reverse(x=sequence, axes=[0], name=ctx.name(node, "reversed"))
        direction = "forward"
    initial_h = _initial_state(ctx, node, 5, batch, directions, hidden, layout, x, "h0")
    initial_c = _initial_state(ctx, node, 6, batch, directions, hidden, layout, x, "c0")
    y, h, c = mb.lstm(
        x=sequence, initial_h=initial_h, initial_c=initial_c, direction=direction, output_sequence=True,
        recurrent_activation=recurrent, cell_activation=cell, activation=output, name=ctx.name(node, "lstm"),
        **kwargs,
    )
    outputs = list(node.outputs) + [None] * 3

    def wanted(k):
        return outputs[k] is not None and outputs[k].name != ""

    if reverse:
        y = mb.reverse(x=y, axes=[0], name=ctx.name(node, "y_in_order"))
    results = [None, None, None]
    if wanted(0):  # [T, B, D*H] -> ONNX [T, D, B, H] (layout 1: [B, T, D, H])
        split = mb.reshape(x=y, shape=[steps, batch, directions, hidden], name=ctx.name(node, "y_split"))
        perm = [0, 2, 1, 3] if layout == 0 else [1, 0, 2, 3]
        results[0] = mb.transpose(x=split, perm=perm, name=ctx.name(node))
    for k, state, tag in ((1, h, "y_h"), (2, c, "y_c")):
        if wanted(k):  # [B, D*H] -> ONNX [D, B, H] (layout 1: [B, D, H])
            split = mb.reshape(x=state, shape=[batch, directions, hidden], name=ctx.name(node, tag + "_split"))
            results[k] = (mb.transpose(x=split, perm=[1, 0, 2], name=ctx.name(node, tag)) if layout == 0
                          else mb.identity(x=split, name=ctx.name(node, tag)))
    return tuple(results)
