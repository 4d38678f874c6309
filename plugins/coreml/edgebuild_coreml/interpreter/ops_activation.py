"""Activation evaluators (MIL ``activation.py`` op defs, iOS15 and iOS17)."""

from __future__ import annotations

import numpy as np
from scipy.special import erf

from ._params import as_float, param, per_channel, scalar
from .registry import evaluates

ELEMENTWISE_CHUNK = 1 << 16  # values per slice where an activation needs temporaries


def _sigmoid(v: np.ndarray) -> np.ndarray:
    # exp(-|v|) never overflows; 1 / (1 + e) for v >= 0 and e / (1 + e) below give 1 / (1 + exp(-v)).
    # A slice at a time, in place: the temporaries of a full-resolution activation would be
    # several times its size.
    v = np.asarray(v)
    out = np.empty(v.shape, v.dtype)
    flat_in, flat_out = v.reshape(-1), out.reshape(-1)
    for start in range(0, flat_in.size, ELEMENTWISE_CHUNK):
        part, result = flat_in[start:start + ELEMENTWISE_CHUNK], flat_out[start:start + ELEMENTWISE_CHUNK]
        e = np.abs(part)
        np.negative(e, out=e)
        np.exp(e, out=e)
        np.copyto(result, e)  # NaN stays NaN
        np.copyto(result, 1.0, where=part >= 0)
        e += 1.0
        result /= e
    return out


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, v).astype(v.dtype)


def _alpha(op, x):
    return scalar(param(op, x, "alpha"))


def _beta(op, x):
    return scalar(param(op, x, "beta"))


def _float_operand(x, donated) -> tuple[np.ndarray, np.ndarray | None]:
    """(x["x"] widened to float32, an array the result may be written into or None): the
    widened copy is the evaluator's own, a donated float32 input too."""
    value = as_float(x["x"])
    return value, value if value is not x["x"] or "x" in donated else None


@evaluates("relu", inplace=True)
def relu(op, x, donated=()):
    value, out = _float_operand(x, donated)
    return np.maximum(value, 0, out=out)


@evaluates("relu6")
def relu6(op, x):
    return np.clip(as_float(x["x"]), 0, 6)


@evaluates("leaky_relu")
def leaky_relu(op, x):
    v = as_float(x["x"])
    return np.where(v >= 0, v, v * _alpha(op, x))


@evaluates("elu")
def elu(op, x):
    v = as_float(x["x"])
    return np.where(v > 0, v, _alpha(op, x) * np.expm1(np.minimum(v, 0)))


@evaluates("clamped_relu")
def clamped_relu(op, x):
    v = as_float(x["x"])
    alpha, beta = _alpha(op, x), _beta(op, x)
    return np.minimum(np.maximum(v, 0), beta) + np.minimum(np.minimum(v, 0) * alpha, beta)


@evaluates("thresholded_relu")
def thresholded_relu(op, x):
    v = as_float(x["x"])
    return np.where(v >= _alpha(op, x), v, 0).astype(v.dtype)


@evaluates("prelu")
def prelu(op, x):
    v = as_float(x["x"])
    alpha = per_channel(as_float(x["alpha"]), v.ndim)
    return np.where(v > 0, v, v * alpha)


@evaluates("gelu")
def gelu(op, x):
    v = as_float(x["x"])
    mode = scalar(param(op, x, "mode", "EXACT"))
    if mode == "TANH_APPROXIMATION":
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
    if mode == "SIGMOID_APPROXIMATION":
        return v * _sigmoid(1.702 * v)
    return (0.5 * v * (1 + erf(v / np.sqrt(2)))).astype(v.dtype)


@evaluates("sigmoid")
def sigmoid(op, x):
    return _sigmoid(as_float(x["x"]))


@evaluates("sigmoid_hard", inplace=True)
def sigmoid_hard(op, x, donated=()):
    value, out = _float_operand(x, donated)
    out = np.multiply(value, np.float32(_alpha(op, x)), out=out)
    out += np.float32(_beta(op, x))
    return np.clip(out, 0, 1, out=out)


@evaluates("silu", inplace=True)
def silu(op, x, donated=()):
    v, own = _float_operand(x, donated)
    out = _sigmoid(v)
    with np.errstate(invalid="ignore"):  # silu(-inf) = 0 * -inf: NaN, as in IEEE arithmetic
        if own is not None:
            own *= out
            return own
        out *= v
    return out


@evaluates("softplus")
def softplus(op, x):
    return _softplus(as_float(x["x"]))


@evaluates("softplus_parametric")
def softplus_parametric(op, x):
    v = as_float(x["x"])
    alpha = per_channel(as_float(x["alpha"]), v.ndim)
    beta = per_channel(as_float(x["beta"]), v.ndim)
    return alpha * _softplus(v * beta)


@evaluates("softsign")
def softsign(op, x):
    v = as_float(x["x"])
    return v / (1 + np.abs(v))


@evaluates("scaled_tanh")
def scaled_tanh(op, x):
    return _alpha(op, x) * np.tanh(_beta(op, x) * as_float(x["x"]))


@evaluates("linear_activation")
def linear_activation(op, x):
    return _alpha(op, x) * as_float(x["x"]) + _beta(op, x)


@evaluates("softmax")
def softmax(op, x):
    v = as_float(x["x"])
    axis = int(scalar(param(op, x, "axis", -1)))
    e = np.exp(v - np.max(v, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


#: Activations named by string in the recurrent ops (``lstm``/``gru``/``rnn``), with the
#: default parameters those ops use (``scaled_tanh`` and ``hard_sigmoid`` use alpha/beta
#: defaults 1,1 and 0.2,0.5 as in the NeuralNetwork spec).
RECURRENT_ACTIVATIONS = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "scaled_tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0),
    "linear": lambda v: v,
    "hard_sigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
    "sigmoid_hard": lambda v: np.clip(0.2 * v + 0.5, 0, 1),
}
