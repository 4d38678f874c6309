"""Activation functions, elementwise."""

from __future__ import annotations

import math

import numpy as np

from edgebuild.reference import slices
from edgebuild.reference.slices import flat_slices, float_type, map_in_float64
from edgebuild.reference.special import erf

GELU_MODES = ("none", "tanh", "sigmoid")


# float32's exp(-x) overflows below -88.72, where sigmoid(x) is a denormal: slices reaching below
# this go the stable way, so the direct float32 forms below never meet an overflow.
FLOAT32_DIRECT_FLOOR = np.float32(-88.0)


def sigmoid(x) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in ``x``'s float type, without overflow, a slice at a time; NaN stays
    NaN. A float32 slice above ``FLOAT32_DIRECT_FLOOR`` takes the direct form, four in-place passes."""
    x = np.asarray(x)
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    out = np.empty(x.shape, x.dtype)
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    for part in flat_slices(flat_in.size):
        value, result = flat_in[part], flat_out[part]
        if _direct_float32(value):
            np.negative(value, out=result)
            np.exp(result, out=result)
            result += np.float32(1)
            np.reciprocal(result, out=result)
        else:
            _stable_sigmoid(value, result)
    return out


def _direct_float32(value: np.ndarray) -> bool:
    """Whether the float32 slice ``value`` may take the direct ``1 + exp(-x)`` forms (not with a
    NaN in it, which would hide its minimum)."""
    return value.dtype == np.float32 and bool(np.min(value) >= FLOAT32_DIRECT_FLOOR)


def _stable_sigmoid(value: np.ndarray, result: np.ndarray) -> None:
    """exp(-|x|) never overflows, and ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)`` below are
    the same function."""
    e = np.abs(value)
    np.negative(e, out=e)
    np.exp(e, out=e)
    np.copyto(result, e)  # NaN stays NaN
    np.copyto(result, 1.0, where=value >= 0)
    e += 1.0
    result /= e


def silu(x, *, out: np.ndarray | None = None) -> np.ndarray:
    """``x * sigmoid(x)``, written into ``out`` when given (which may be ``x`` itself). float32
    computes ``x / (1 + exp(-x))``, as ``sigmoid`` does, a slice at a time."""
    x = np.asarray(x)
    if x.dtype == np.float32 and (out is None or out.dtype == np.float32):
        if out is not None and out.flags.c_contiguous:
            return _silu_float32(x, out)
        result = _silu_float32(x, np.empty(x.shape, np.float32))
        if out is None:
            return result
        np.copyto(out, result)  # an ``out`` with no flat view to write through
        return out
    gate = sigmoid(x)
    with np.errstate(invalid="ignore"):  # silu(-inf) = 0 * -inf: NaN, as in IEEE arithmetic
        if out is None:
            gate *= x
            return gate
        return np.multiply(x, gate, out=out)


def _silu_float32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    # one slice-sized scratch for every slice: ``out`` may be ``x`` itself, which the last pass reads
    scratch = np.empty(min(slices.SLICE_VALUES, flat_in.size), np.float32)
    for part in flat_slices(flat_in.size):
        value, gate = flat_in[part], scratch[:flat_in[part].size]
        if _direct_float32(value):
            np.negative(value, out=gate)
            np.exp(gate, out=gate)
            gate += np.float32(1)
            np.divide(value, gate, out=flat_out[part])
        else:
            _stable_sigmoid(value, gate)
            with np.errstate(invalid="ignore"):  # silu(-inf) = 0 * -inf: NaN, as in IEEE arithmetic
                np.multiply(value, gate, out=flat_out[part])
    return out


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
