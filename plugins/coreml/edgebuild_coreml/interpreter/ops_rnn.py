"""Recurrent evaluators (MIL ``recurrent.py``, iOS15/17/18): ``lstm``, ``gru``, ``rnn``.

Layouts follow the op docs: lstm gates ``[input, forget, output, cell]``, gru gates
``[reset, output(new), update]``. The time loop is inherent; each step is batched matmuls.
Outputs of a ``reverse`` pass are listed in processing order, as the op tests expect.
"""

from __future__ import annotations

import numpy as np

from ._params import as_float, param, per_op, scalar
from .ops_activation import RECURRENT_ACTIVATIONS
from .registry import evaluates


def _activation(op, x, name, default):
    key = str(scalar(param(op, x, name, default))).lower()
    if key not in RECURRENT_ACTIVATIONS:
        raise ValueError(f"unsupported recurrent activation {key!r}")
    return RECURRENT_ACTIVATIONS[key]


def _steps(seq, reverse):
    return seq[::-1] if reverse else seq


def _outputs(hiddens, output_sequence):
    stacked = np.stack(hiddens)
    return stacked if output_sequence else stacked[-1:]


def _lstm_pass(seq, h, c, w_ih, w_hh, bias, peephole, clip, acts):
    recurrent_act, cell_act, out_act = acts
    hidden = h.shape[-1]
    inputs = seq @ w_ih.T + bias  # all input projections at once: [s, b, 4H]
    w_hh_t = np.ascontiguousarray(w_hh.T)
    hiddens = np.empty((len(inputs),) + h.shape, np.result_type(h, inputs))
    for step, projected in enumerate(inputs):
        gates = np.matmul(h, w_hh_t)
        gates += projected
        if peephole is None:  # gates [input, forget, output] are one activation call
            i, f, o = np.split(recurrent_act(gates[:, :3 * hidden]), 3, axis=-1)
            c = f * c + i * cell_act(gates[:, 3 * hidden:])
            if clip is not None:
                c = np.clip(c, -clip, clip)
        else:
            p_i, p_f, p_o = np.split(peephole, 3)
            gi, gf, go, gz = np.split(gates, 4, axis=-1)
            i = recurrent_act(gi + c * p_i)
            f = recurrent_act(gf + c * p_f)
            c = f * c + i * cell_act(gz)
            if clip is not None:
                c = np.clip(c, -clip, clip)
            o = recurrent_act(go + c * p_o)
        h = hiddens[step] = o * out_act(c)
    return list(hiddens), h, c


_DEFAULT_ACTS = (RECURRENT_ACTIVATIONS["sigmoid"], RECURRENT_ACTIVATIONS["tanh"], RECURRENT_ACTIVATIONS["tanh"])


def _halved_sigmoid_gates(w_ih, w_hh, bias):
    """(input weight [In, 4H], recurrent weight [H, 4H], bias [4H]) transposed for ``x @ w``, the
    sigmoid gates' columns halved (see ``_lstm_pass_default``)."""
    hidden = w_hh.shape[1]
    half = np.ones(4 * hidden, np.result_type(w_ih, w_hh, bias))
    half[:3 * hidden] = 0.5  # gates [input, forget, output] halved, [cell] as it is
    return (np.ascontiguousarray(w_ih.T * half), np.ascontiguousarray(w_hh.T * half), bias * half)


def _lstm_pass_default(seq, h, c, halved, clip):
    """``_lstm_pass`` with sigmoid gates and tanh cell and output (every LSTM an ONNX model
    names no activations for) in a few whole-row numpy calls per step, into buffers made once:
    sigmoid(x) is ``0.5 * tanh(x / 2) + 0.5``, and the halving is folded into the sigmoid gates'
    weights and bias (``halved``: ``_halved_sigmoid_gates``; exact, a power of two), so one
    ``tanh`` serves all four gates. Per-step Python is what a short sequence costs."""
    w_ih_t, w_hh_t, bias = halved
    hidden = h.shape[-1]
    inputs = seq @ w_ih_t + bias  # all input projections at once: [s, b, 4H]
    dtype = np.result_type(h, inputs)
    hiddens = np.empty((len(inputs),) + h.shape, dtype)
    c = np.array(c, dtype)  # updated in place below
    gates = np.empty(inputs.shape[1:], dtype)
    scratch = np.empty(h.shape, dtype)
    i, f, o, z = (gates[..., k * hidden:(k + 1) * hidden] for k in range(4))
    sigmoids = gates[..., :3 * hidden]
    for step, projected in enumerate(inputs):
        np.matmul(h, w_hh_t, out=gates)
        gates += projected
        np.tanh(gates, out=gates)
        sigmoids *= 0.5
        sigmoids += 0.5
        c *= f
        np.multiply(i, z, out=scratch)
        c += scratch
        if clip is not None:
            np.clip(c, -clip, clip, out=c)
        h = hiddens[step]
        np.tanh(c, out=h)
        h *= o
    return list(hiddens), h, c


@evaluates("lstm")
def lstm(op, x):
    seq = as_float(x["x"])
    direction = str(scalar(param(op, x, "direction", "forward")))
    output_sequence = bool(scalar(param(op, x, "output_sequence", False)))
    acts = (
        _activation(op, x, "recurrent_activation", "sigmoid"),
        _activation(op, x, "cell_activation", "tanh"),
        _activation(op, x, "activation", "tanh"),
    )
    clip = x.get("clip")
    clip = None if clip is None else float(scalar(clip))
    h0, c0 = as_float(x["initial_h"]), as_float(x["initial_c"])
    hidden = np.asarray(x["weight_hh"]).shape[1]

    def run(suffix, h, c, reverse):
        raw = (x[f"weight_ih{suffix}"], x[f"weight_hh{suffix}"], x.get(f"bias{suffix}"))  # the plan's constants
        w_ih, w_hh = as_float(x[f"weight_ih{suffix}"]), as_float(x[f"weight_hh{suffix}"])
        bias = x.get(f"bias{suffix}")
        bias = np.zeros(4 * hidden, np.float32) if bias is None else as_float(bias)
        peephole = x.get(f"peephole{suffix}")
        peephole = None if peephole is None else as_float(peephole)
        if peephole is None and acts == _DEFAULT_ACTS:
            halved = per_op(op, f"_edgebuild_lstm_halved{suffix}", raw, (), lambda: _halved_sigmoid_gates(w_ih, w_hh, bias))
            return _lstm_pass_default(_steps(seq, reverse), h, c, halved, clip)
        hiddens, h, c = _lstm_pass(_steps(seq, reverse), h, c, w_ih, w_hh, bias, peephole, clip, acts)
        return hiddens, h, c

    if direction == "bidirectional":
        fwd, h_f, c_f = run("", h0[:, :hidden], c0[:, :hidden], False)
        bwd, h_b, c_b = run("_back", h0[:, hidden:], c0[:, hidden:], True)
        # Backward outputs are aligned with the input time steps before concatenation.
        out = np.concatenate([np.stack(fwd), np.stack(bwd[::-1])], axis=-1)
        out = out if output_sequence else np.concatenate([fwd[-1], bwd[-1]], axis=-1)[None]
        return out, np.concatenate([h_f, h_b], -1), np.concatenate([c_f, c_b], -1)
    hiddens, h, c = run("", h0, c0, direction == "reverse")
    return _outputs(hiddens, output_sequence), h, c


@evaluates("gru")
def gru(op, x):
    seq = as_float(x["x"])
    reverse = str(scalar(param(op, x, "direction", "forward"))) == "reverse"
    output_sequence = bool(scalar(param(op, x, "output_sequence", False)))
    recurrent_act = _activation(op, x, "recurrent_activation", "sigmoid")
    act = _activation(op, x, "activation", "tanh")
    reset_after = bool(scalar(param(op, x, "reset_after", False)))
    w_ih, w_hh = as_float(x["weight_ih"]), as_float(x["weight_hh"])
    hidden = w_hh.shape[1]
    bias = x.get("bias")
    bias = np.zeros(3 * hidden, np.float32) if bias is None else as_float(bias)
    input_bias = x.get("input_bias")
    input_bias = np.zeros(3 * hidden, np.float32) if input_bias is None else as_float(input_bias)

    w_hr, w_ho, w_hz = np.split(w_hh, 3)
    b_r, b_o, b_z = np.split(bias, 3)
    h = as_float(x["initial_h"])
    inputs = _steps(seq, reverse) @ w_ih.T + input_bias  # [s, b, 3H]
    hiddens = []
    for projected in inputs:
        x_r, x_o, x_z = np.split(projected, 3, axis=-1)
        r = recurrent_act(x_r + h @ w_hr.T + b_r)
        z = recurrent_act(x_z + h @ w_hz.T + b_z)
        if reset_after:
            o = act(x_o + r * (h @ w_ho.T + b_o))
        else:
            o = act(x_o + (r * h) @ w_ho.T + b_o)
        h = (1 - z) * o + z * h
        hiddens.append(h)
    return _outputs(hiddens, output_sequence), h


@evaluates("rnn")
def rnn(op, x):
    seq = as_float(x["x"])
    reverse = str(scalar(param(op, x, "direction", "forward"))) == "reverse"
    output_sequence = bool(scalar(param(op, x, "output_sequence", False)))
    act = _activation(op, x, "activation", "tanh")
    w_ih, w_hh = as_float(x["weight_ih"]), as_float(x["weight_hh"])
    bias = x.get("bias")
    bias = 0.0 if bias is None else as_float(bias)
    h = as_float(x["initial_h"])
    hiddens = []
    for projected in _steps(seq, reverse) @ w_ih.T + bias:
        h = act(projected + h @ w_hh.T)
        hiddens.append(h)
    return _outputs(hiddens, output_sequence), h
