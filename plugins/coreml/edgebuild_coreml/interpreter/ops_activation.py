"""Activation evaluators (MIL ``activation.py`` op defs, iOS15 and iOS17)."""

from __future__ import annotations

import numpy as np

from edgebuild.plugin.reference import activations, reductions

from . import torch_kernels as kernels
from ._params import as_float, param, per_channel, per_op, scalar
from .fusion import relu as clipped_relu
from .registry import evaluates

_GELU_MODES = {"EXACT": "none", "TANH_APPROXIMATION": "tanh", "SIGMOID_APPROXIMATION": "sigmoid"}


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
    return clipped_relu(value, out) if isinstance(value, np.ndarray) and value.ndim else np.maximum(value, 0, out=out)


@evaluates("relu6")
def relu6(op, x):
    return np.clip(as_float(x["x"]), 0, 6)


@evaluates("leaky_relu")
def leaky_relu(op, x):
    return activations.leaky_relu(as_float(x["x"]), _alpha(op, x))


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
    mode = _GELU_MODES.get(scalar(param(op, x, "mode", "EXACT")), "none")
    value = as_float(x["x"])
    borrowed = kernels.gelu(value, mode)
    return activations.gelu(value, mode) if borrowed is None else borrowed


@evaluates("sigmoid")
def sigmoid(op, x):
    return activations.sigmoid(as_float(x["x"]))


@evaluates("sigmoid_hard", inplace=True)
def sigmoid_hard(op, x, donated=()):
    value, out = _float_operand(x, donated)
    dtype = value.dtype.type
    alpha, beta, zero, one = per_op(op, "_edgebuild_sigmoid_hard", (x.get("alpha"), x.get("beta")), (dtype,),
                                    lambda: (dtype(_alpha(op, x)), dtype(_beta(op, x)), dtype(0), dtype(1)))
    result = np.multiply(value, alpha, out=out)
    if not isinstance(result, np.ndarray):  # a 0-d input gives a scalar
        return np.clip(result + beta, zero, one)
    result += beta
    # one clip: numpy's maximum and minimum pair takes several times as long on float arrays
    # (the array's own method: np.clip's dispatch wrapper cost a quarter of it on a conv net's maps)
    return result.clip(zero, one, out=result)


@evaluates("silu", inplace=True)
def silu(op, x, donated=()):
    value, out = _float_operand(x, donated)
    borrowed = kernels.silu(value, out=out)  # torch's where its kernels are on
    return activations.silu(value, out=out) if borrowed is None else borrowed


@evaluates("softplus")
def softplus(op, x):
    return activations.softplus(as_float(x["x"]))


@evaluates("softplus_parametric")
def softplus_parametric(op, x):
    v = as_float(x["x"])
    alpha = per_channel(as_float(x["alpha"]), v.ndim)
    beta = per_channel(as_float(x["beta"]), v.ndim)
    return alpha * activations.softplus(v * beta)


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
    value, axis = as_float(x["x"]), int(scalar(param(op, x, "axis", -1)))
    borrowed = kernels.softmax(value, axis)
    return reductions.softmax(value, axis=axis) if borrowed is None else borrowed


#: Activations named by string in the recurrent ops (``lstm``/``gru``/``rnn``), with the
#: default parameters those ops use (``scaled_tanh`` and ``hard_sigmoid`` use alpha/beta
#: defaults 1,1 and 0.2,0.5 as in the NeuralNetwork spec).
RECURRENT_ACTIVATIONS = {
    "sigmoid": activations.sigmoid,
    "tanh": np.tanh,
    "scaled_tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0),
    "linear": lambda v: v,
    "hard_sigmoid": activations.hard_sigmoid,
    "sigmoid_hard": activations.hard_sigmoid,
}
