"""LSTM, GRU and RNN: MIL's fused ``lstm``/``gru``/``rnn`` when they mean exactly the ONNX op,
otherwise an exact unroll over the static sequence (``_recurrent_unrolled.py``).

The fused ops need constant weights and know only plain sigmoid/tanh/relu, full-length
sequences and no gate clipping. Gate orders differ: ONNX LSTM stacks i, o, f, c and MIL i, f,
o, z(=c); ONNX GRU stacks z, r, h and MIL r, o(=h), z. MIL's gru applies the reset gate to
the hidden state before the recurrent matmul, which is ONNX's linear_before_reset=0; its
iOS18 ``reset_after`` form is not used (coremltools marks its on-device parity with the
reset-after formula as a known failure), so linear_before_reset=1 unrolls.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.context import target_index
from edgebuild_coreml.lowering.ops import _recurrent_unrolled as unrolled
from edgebuild_coreml.lowering.ops._nn_util import as_float
from edgebuild_coreml.lowering.ops._recurrent import (
    RecurrentSpec,
    assemble_outputs,
    constant,
    initial_state,
    is_constant,
    parse,
    per_direction,
)
from edgebuild_coreml.lowering.registry import lowers


def _operands(ctx, node, indices):
    return [as_float(ctx.input(node, i, optional=i > 2)) for i in indices]


def _fused_allowed(ctx, spec: RecurrentSpec, operands) -> bool:
    """Whether a fused MIL op can express this node exactly."""
    simple = all(a.mil_simple for acts in spec.activations for a in acts)
    same = all(acts == spec.activations[0] for acts in spec.activations)
    fp_ok = spec.dtype == np.float32 or target_index(ctx.target) >= target_index("iOS17")
    return (simple and same and fp_ok and spec.clip is None and spec.lengths is None
            and all(is_constant(v) for v in operands))


def _reorder(array: np.ndarray, hidden: int, order: list[int]) -> np.ndarray:
    blocks = [array[k * hidden:(k + 1) * hidden] for k in range(len(order))]
    return np.concatenate([blocks[k] for k in order])


def _fused_sequence(ctx, node, spec: RecurrentSpec, d: int, build):
    """Run a single-direction fused op; a reverse direction runs forward on the reversed input."""
    sequence = spec.x
    reverse = spec.directions[d] == "reverse"
    if reverse:  # no doubt about the fused op's output order this way
        sequence = mb.reverse(x=sequence, axes=[0], name=ctx.name(node, f"d{d}_reversed"))
    y, *states = build(sequence)
    if reverse:
        y = mb.reverse(x=y, axes=[0], name=ctx.name(node, f"d{d}_y_in_order"))
    return y, states


def _initial_states(ctx, node, spec, index, tag):
    return [as_float(initial_state(ctx, node, index, spec, d, f"{tag}{d}")) for d in range(spec.num_directions)]


# -- LSTM -----------------------------------------------------------------------------------
@lowers("LSTM", since=7)
def lstm(ctx, node):
    spec = parse(ctx, node, default_activations=["sigmoid", "tanh", "tanh"])
    w, r, b, p = _operands(ctx, node, (1, 2, 3, 7))
    input_forget = bool(int(ctx.attr(node, "input_forget", 0)))
    h0 = _initial_states(ctx, node, spec, 5, "h0_")
    c0 = _initial_states(ctx, node, spec, 6, "c0_")
    if not input_forget and _fused_allowed(ctx, spec, (w, r, b, p)):
        return _lstm_fused(ctx, node, spec, constant(w), constant(r), constant(b), constant(p), h0, c0)
    hidden = spec.hidden
    sequences, finals_h, finals_c = [], [], []
    for d in range(spec.num_directions):
        cell = unrolled.Cell(ctx, node, spec, d)
        b_d = per_direction(ctx, node, b, d, "b")
        bias = unrolled.add(ctx, node, unrolled.part(ctx, node, b_d, 0, 4 * hidden, 0, f"wb{d}"),
                            unrolled.part(ctx, node, b_d, 1, 4 * hidden, 0, f"rb{d}"), f"bias{d}")
        p_d = per_direction(ctx, node, p, d, "p")
        peepholes = None if p_d is None else [unrolled.part(ctx, node, p_d, k, hidden, 0, f"p{d}_{k}") for k in range(3)]
        if peepholes is not None and isinstance(p_d, np.ndarray):
            peepholes = [v.astype(spec.dtype) for v in peepholes]
        step = unrolled.lstm_step(cell, per_direction(ctx, node, r, d, "r"), peepholes, input_forget)
        projected = cell.input_projection(per_direction(ctx, node, w, d, "w"), bias)
        y, (h, c) = unrolled.run(cell, step, projected, (h0[d], c0[d]))
        sequences.append(y)
        finals_h.append(h)
        finals_c.append(c)
    return assemble_outputs(ctx, node, spec, sequences, [finals_h, finals_c])


def _lstm_fused(ctx, node, spec, w, r, b, p, h0, c0):
    hidden, dtype = spec.hidden, spec.dtype
    iofc_to_ifoc = [0, 2, 1, 3]
    if b is None:
        b = np.zeros([spec.num_directions, 8 * hidden], np.float32)

    def params(d):
        found = {
            "weight_ih": _reorder(w[d], hidden, iofc_to_ifoc).astype(dtype),
            "weight_hh": _reorder(r[d], hidden, iofc_to_ifoc).astype(dtype),
            "bias": _reorder(b[d, :4 * hidden] + b[d, 4 * hidden:], hidden, iofc_to_ifoc).astype(dtype),
        }
        if p is not None:
            found["peephole"] = _reorder(p[d], hidden, [0, 2, 1]).astype(dtype)  # i, o, f -> i, f, o
        return found

    f_act, g_act, h_act = (a.mil_simple for a in spec.activations[0])
    acts = {"recurrent_activation": f_act, "cell_activation": g_act, "activation": h_act}
    if spec.num_directions == 2:  # one bidirectional op: outputs [T, B, 2H], states [B, 2H]
        kwargs = {**params(0), **{f"{k}_back": v for k, v in params(1).items()}}
        both_h = mb.concat(values=[_var(v) for v in h0], axis=-1, name=ctx.name(node, "h0"))
        both_c = mb.concat(values=[_var(v) for v in c0], axis=-1, name=ctx.name(node, "c0"))
        y, h, c = mb.lstm(x=spec.x, initial_h=both_h, initial_c=both_c, direction="bidirectional",
                          output_sequence=True, name=ctx.name(node, "lstm"), **acts, **kwargs)
        split = [mb.split(x=v, num_splits=2, axis=-1, name=ctx.name(node, f"{tag}_dirs"))
                 for v, tag in ((y, "y"), (h, "y_h"), (c, "y_c"))]
        return assemble_outputs(ctx, node, spec, list(split[0]), [list(split[1]), list(split[2])])

    def build(sequence):
        return mb.lstm(x=sequence, initial_h=_var(h0[0], dtype), initial_c=_var(c0[0], dtype), output_sequence=True,
                       name=ctx.name(node, "lstm"), **acts, **params(0))

    y, (h, c) = _fused_sequence(ctx, node, spec, 0, build)
    return assemble_outputs(ctx, node, spec, [y], [[h], [c]])


def _var(value, dtype=np.float32):
    return value.astype(dtype) if isinstance(value, np.ndarray) else value


# -- GRU ------------------------------------------------------------------------------------
@lowers("GRU", since=7)
def gru(ctx, node):
    spec = parse(ctx, node, default_activations=["sigmoid", "tanh"])
    w, r, b = _operands(ctx, node, (1, 2, 3))
    linear_before_reset = bool(int(ctx.attr(node, "linear_before_reset", 0)))
    h0 = _initial_states(ctx, node, spec, 5, "h0_")
    if not linear_before_reset and _fused_allowed(ctx, spec, (w, r, b)):
        return _gru_fused(ctx, node, spec, constant(w), constant(r), constant(b), h0)
    hidden = spec.hidden
    sequences, finals = [], []
    for d in range(spec.num_directions):
        cell = unrolled.Cell(ctx, node, spec, d)
        b_d = per_direction(ctx, node, b, d, "b")
        input_bias = unrolled.part(ctx, node, b_d, 0, 3 * hidden, 0, f"wb{d}")
        recurrent_bias = unrolled.part(ctx, node, b_d, 1, 3 * hidden, 0, f"rb{d}")
        recurrent_h_bias = None
        if linear_before_reset and recurrent_bias is not None:  # R's h bias stays inside r * (...)
            recurrent_h_bias = unrolled.part(ctx, node, recurrent_bias, 2, hidden, 0, f"rbh{d}")
            recurrent_bias = _zero_last_block(ctx, node, recurrent_bias, hidden, spec.dtype, d)
        bias = unrolled.add(ctx, node, input_bias, recurrent_bias, f"bias{d}")
        if isinstance(recurrent_h_bias, np.ndarray):
            recurrent_h_bias = recurrent_h_bias.astype(spec.dtype)
        r_d = per_direction(ctx, node, r, d, "r")
        step = unrolled.gru_step(cell, unrolled.part(ctx, node, r_d, 0, 2 * hidden, 0, f"rzr{d}"),
                                 unrolled.part(ctx, node, r_d, 2, hidden, 0, f"rh{d}"),
                                 recurrent_h_bias, linear_before_reset)
        projected = cell.input_projection(per_direction(ctx, node, w, d, "w"), bias)
        y, (h,) = unrolled.run(cell, step, projected, (h0[d],))
        sequences.append(y)
        finals.append(h)
    return assemble_outputs(ctx, node, spec, sequences, [finals])


def _zero_last_block(ctx, node, bias, hidden, dtype, d):
    """[b_z, b_r, b_h] -> [b_z, b_r, 0]."""
    if isinstance(bias, np.ndarray):
        return np.concatenate([bias[:2 * hidden], np.zeros(hidden, bias.dtype)])
    head = unrolled.part(ctx, node, bias, 0, 2 * hidden, 0, f"rbzr{d}")
    return mb.concat(values=[head, np.zeros(hidden, dtype)], axis=0, name=ctx.name(node, f"rb_zr0_{d}"))


def _gru_fused(ctx, node, spec, w, r, b, h0):
    hidden, dtype = spec.hidden, spec.dtype
    zrh_to_rhz = [1, 2, 0]
    f_act, g_act = (a.mil_simple for a in spec.activations[0])
    sequences, finals = [], []
    for d in range(spec.num_directions):
        bias = np.zeros(3 * hidden, np.float32) if b is None else b[d, :3 * hidden] + b[d, 3 * hidden:]

        def build(sequence, d=d, bias=bias):
            return mb.gru(x=sequence, initial_h=_var(h0[d], dtype), output_sequence=True,
                          weight_ih=_reorder(w[d], hidden, zrh_to_rhz).astype(dtype),
                          weight_hh=_reorder(r[d], hidden, zrh_to_rhz).astype(dtype),
                          bias=_reorder(bias, hidden, zrh_to_rhz).astype(dtype),
                          recurrent_activation=f_act, activation=g_act, name=ctx.name(node, f"gru{d}"))

        y, (h,) = _fused_sequence(ctx, node, spec, d, build)
        sequences.append(y)
        finals.append(h)
    return assemble_outputs(ctx, node, spec, sequences, [finals])


# -- RNN ------------------------------------------------------------------------------------
@lowers("RNN", since=7)
def rnn(ctx, node):
    spec = parse(ctx, node, default_activations=["tanh"])
    w, r, b = _operands(ctx, node, (1, 2, 3))
    h0 = _initial_states(ctx, node, spec, 5, "h0_")
    hidden = spec.hidden
    fused = _fused_allowed(ctx, spec, (w, r, b))
    sequences, finals = [], []
    for d in range(spec.num_directions):
        if fused:
            y, (h,) = _rnn_fused(ctx, node, spec, d, constant(w), constant(r), constant(b), h0)
        else:
            cell = unrolled.Cell(ctx, node, spec, d)
            b_d = per_direction(ctx, node, b, d, "b")
            bias = unrolled.add(ctx, node, unrolled.part(ctx, node, b_d, 0, hidden, 0, f"wb{d}"),
                                unrolled.part(ctx, node, b_d, 1, hidden, 0, f"rb{d}"), f"bias{d}")
            step = unrolled.rnn_step(cell, per_direction(ctx, node, r, d, "r"))
            projected = cell.input_projection(per_direction(ctx, node, w, d, "w"), bias)
            y, (h,) = unrolled.run(cell, step, projected, (h0[d],))
        sequences.append(y)
        finals.append(h)
    return assemble_outputs(ctx, node, spec, sequences, [finals])


def _rnn_fused(ctx, node, spec, d, w, r, b, h0):
    hidden, dtype = spec.hidden, spec.dtype
    bias = np.zeros(hidden, np.float32) if b is None else b[d, :hidden] + b[d, hidden:]

    def build(sequence):
        return mb.rnn(x=sequence, initial_h=_var(h0[d], dtype), weight_ih=w[d].astype(dtype),
                      weight_hh=r[d].astype(dtype), bias=bias.astype(dtype), output_sequence=True,
                      activation=spec.activations[d][0].mil_simple, name=ctx.name(node, f"rnn{d}"))

    return _fused_sequence(ctx, node, spec, d, build)
