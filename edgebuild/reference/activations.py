"""Activation functions, elementwise."""

from __future__ import annotations

import math

import numpy as np

from edgebuild.reference.slices import flat_slices, float_type, map_in_float64
from edgebuild.reference.special import erf

GELU_MODES = ("none", "tanh", "sigmoid")


def sigmoid(x) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in ``x``'s float type, without overflow: exp(-|x|) never overflows,
    and ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below are the same function. Computed in
    place a slice at a time; NaN stays NaN."""
    x = np.asarray(x)
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    out = np.empty(x.shape, x.dtype)
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    for part in flat_slices(flat_in.size):
        value, result = flat_in[part], flat_out[part]
        e = np.abs(value)
        np.negative(e, out=e)
        np.exp(e, out=e)
        np.copyto(result, e)  # NaN stays NaN
        np.copyto(result, 1.0, where=value >= 0)
        e += 1.0
        result /= e
    return out


def silu(x, *, out: np.ndarray | None = None) -> np.ndarray:
    """``x * sigmoid(x)``, written into ``out`` when given (which may be ``x`` itself)."""
    x = np.asarray(x)
    gate = sigmoid(x)
    with np.errstate(invalid="ignore"):  # silu(-inf) = 0 * -inf: NaN, as in IEEE arithmetic
        if out is None:
            gate *= x
            return gate
        return np.multiply(x, gate, out=out)


def gelu(x, approximate: str = "none") -> np.ndarray:
    """GELU computed in float64, returned in ``x``'s float type: ``approximate="none"`` the exact
    ``x * Phi(x)`` (erf), ``"tanh"`` the tanh approximation, ``"sigmoid"`` ``x * sigmoid(1.702 x)``."""
    if approximate not in GELU_MODES:
        raise ValueError(f"Gelu: approximate must be one of {', '.join(GELU_MODES)}, got {approximate!r}")
    return map_in_float64(_GELU[approximate], x)


def _gelu_erf(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _gelu_sigmoid(v: np.ndarray) -> np.ndarray:
    return v * sigmoid(1.702 * v)


_GELU = {"none": _gelu_erf, "tanh": _gelu_tanh, "sigmoid": _gelu_sigmoid}


def hard_sigmoid(x, alpha: float = 0.2, beta: float = 0.5, *, out: np.ndarray | None = None) -> np.ndarray:
    """``clip(alpha * x + beta, 0, 1)`` in ``x``'s float type, into ``out`` when given."""
    x = np.asarray(x)
    dtype = float_type(x)
    out = np.multiply(x, dtype.type(alpha), out=out, dtype=dtype)
    out += dtype.type(beta)
    np.maximum(out, dtype.type(0), out=out)  # max then min: np.clip's generic loop is several times slower
    return np.minimum(out, dtype.type(1), out=out)


def leaky_relu(x, alpha: float) -> np.ndarray:
    """``x`` where ``x >= 0``, ``alpha * x`` elsewhere, in ``x``'s dtype."""
    x = np.asarray(x)
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype))


def softplus(x) -> np.ndarray:
    """``log(1 + exp(x))`` without overflow, in ``x``'s float type."""
    x = np.asarray(x)
    return np.logaddexp(0, x).astype(float_type(x), copy=False)


def swiglu(gate, up) -> np.ndarray:
    """``silu(gate) * up``: the SiLU-gated MLP's activation (Llama's ``act(gate_proj(x)) * up_proj(x)``)."""
    return silu(np.asarray(gate)) * up
