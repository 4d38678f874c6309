"""Activation functions spelled out in primitives -> the one op that names them.

- ReLU6 written as Min/Max or Relu + Min -> ``Clip(x, 0, 6)`` (kept a Clip: every backend has it)
- ``clip(x + 3, 0, 6) / 6`` and ``clip((x + 3) / 6, 0, 1)`` -> ``HardSigmoid(alpha=1/6)``
- ``x * relu6(x + 3) / 6`` and ``x * HardSigmoid(x)`` -> ``HardSwish`` (ai.onnx opset 14)
- ``x * sigmoid(x)`` -> ``edgebuild::Silu``
- ``0.5 * x * (1 + erf(x / sqrt 2))`` -> ``edgebuild::Gelu(approximate="none")``
- ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`` -> ``edgebuild::Gelu(approximate="tanh")``

Constants are bound as variables and checked numerically, so ``[]``- and ``[1]``-shaped
constants and small rounding differences between exporters all match.
"""

from __future__ import annotations

import math

import numpy as np
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import EDGEBUILD_DOMAIN, is_scalar, new_initializer

MIN_OPSET = 14  # HardSwish
SQRT_2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _scalars(**expected: float):
    """A rule condition: each named binding is a constant close to the expected number."""

    def check(context, **bindings) -> bool:
        return all(is_scalar(bindings.get(name), value) for name, value in expected.items())

    return check


def _rule(name: str, target, replacement, **expected: float) -> pattern.RewriteRule:
    return pattern.RewriteRule(target, replacement, _scalars(**expected), name=name)


def _three_factor_products(op, a, b, c):
    """Every bracketing of a * b * c (operand order inside each Mul is left to commute)."""
    return [op.Mul(op.Mul(a, b), c), op.Mul(op.Mul(a, c), b), op.Mul(op.Mul(b, c), a)]


# ---- ReLU6 -------------------------------------------------------------------------------


def _min_max(op, x, zero, six):
    return op.Min(op.Max(x, zero), six)


def _max_min(op, x, zero, six):
    return op.Max(op.Min(x, six), zero)


def _relu_min(op, x, six):
    return op.Min(op.Relu(x), six)


def _clip06(op, x, **_):
    zero = new_initializer(op, np.zeros((), _float_dtype(x)), x, "relu6_min")
    six = new_initializer(op, np.full((), 6, _float_dtype(x)), x, "relu6_max")
    return op.Clip(x, zero, six)


def _float_dtype(value):
    return value.dtype.numpy() if value.dtype is not None else np.float32


# ---- HardSigmoid / HardSwish ---------------------------------------------------------------


def _hsig_div(op, x, three, zero, six, divisor):
    return op.Div(op.Clip(op.Add(x, three), zero, six), divisor)


def _hsig_mul(op, x, three, zero, six, sixth):
    return op.Mul(op.Clip(op.Add(x, three), zero, six), sixth)


def _hsig_inner_div(op, x, three, divisor, zero, one):
    return op.Clip(op.Div(op.Add(x, three), divisor), zero, one)


def _hsig_affine(op, x, sixth, half, zero, one):
    return op.Clip(op.Add(op.Mul(x, sixth), half), zero, one)


def _hard_sigmoid(op, x, **_):
    return op.HardSigmoid(x, alpha=1.0 / 6.0, beta=0.5)


def _hswish_div(op, x, three, zero, six, divisor):
    return op.Div(op.Mul(x, op.Clip(op.Add(x, three), zero, six)), divisor)


def _hswish_mul(op, x, three, zero, six, sixth):
    return op.Mul(op.Mul(x, op.Clip(op.Add(x, three), zero, six)), sixth)


def _x_times_hsig(op, x):
    return op.Mul(x, op.HardSigmoid(x, _outputs=["hsig"]))


def _hard_swish(op, x, hsig=None, **_):
    if hsig is not None:
        node = hsig.producer()
        alpha, beta = node.attributes.get("alpha"), node.attributes.get("beta")
        alpha = alpha.as_float() if alpha is not None else 0.2
        beta = beta.as_float() if beta is not None else 0.5
        if not (math.isclose(alpha, 1 / 6, rel_tol=1e-4) and math.isclose(beta, 0.5, rel_tol=1e-4)):
            return None
    return op.HardSwish(x)


# ---- SiLU ---------------------------------------------------------------------------------


def _x_sigmoid(op, x):
    return op.Mul(x, op.Sigmoid(x))


def _silu(op, x, **_):
    return op.Silu(x, _domain=EDGEBUILD_DOMAIN)


# ---- GELU ---------------------------------------------------------------------------------


# The matcher turns a target's parameters into pattern variables, so variants are built by
# factories (closures) rather than default arguments.
def _erf_gelu_target(inner, bracketing: int):
    def target(op, x, k, one, half):
        cdf = op.Add(op.Erf(inner(op, x, k)), one)
        return _three_factor_products(op, x, half, cdf)[bracketing]

    return target


def _tanh_gelu_target(cube, bracketing: int):
    def target(op, x, three, a, c, one, half):
        inner = op.Mul(op.Add(x, op.Mul(cube(op, x, three), a)), c)
        cdf = op.Add(op.Tanh(inner), one)
        return _three_factor_products(op, x, half, cdf)[bracketing]

    return target


def _erf_gelu_patterns():
    """0.5 * x * (1 + erf(x / sqrt2)), with the inner scaling as Div or Mul."""
    inner_forms = {"div": lambda op, x, k: op.Div(x, k), "mul": lambda op, x, k: op.Mul(x, k)}
    patterns = []
    for inner_name, inner in inner_forms.items():
        for bracketing in range(3):
            target = _erf_gelu_target(inner, bracketing)
            expected = {"k": SQRT_2 if inner_name == "div" else 1 / SQRT_2, "one": 1.0, "half": 0.5}
            patterns.append((f"gelu_erf_{inner_name}_{bracketing}", target, expected))
    return patterns


def _tanh_gelu_patterns():
    """0.5 * x * (1 + tanh(c * (x + 0.044715 * x^3))), x^3 as Pow or Mul(Mul(x, x), x)."""
    cube_forms = {
        "pow": lambda op, x, three: op.Pow(x, three),
        "mul": lambda op, x, three: op.Mul(op.Mul(x, x), x),
    }
    patterns = []
    for cube_name, cube in cube_forms.items():
        for bracketing in range(3):
            target = _tanh_gelu_target(cube, bracketing)
            expected = {"a": 0.044715, "c": SQRT_2_OVER_PI, "one": 1.0, "half": 0.5}
            if cube_name == "pow":
                expected["three"] = 3.0
            patterns.append((f"gelu_tanh_{cube_name}_{bracketing}", target, expected))
    return patterns


def _gelu(approximate: str):
    def replacement(op, x, **_):
        return op.Gelu(x, approximate=approximate, _domain=EDGEBUILD_DOMAIN)

    return replacement


RULES = [
    # GELU and HardSwish first: their patterns contain the smaller ones.
    *[_rule(name, target, _gelu("none"), **expected) for name, target, expected in _erf_gelu_patterns()],
    *[_rule(name, target, _gelu("tanh"), **expected) for name, target, expected in _tanh_gelu_patterns()],
    _rule("hardswish_div", _hswish_div, _hard_swish, three=3, zero=0, six=6, divisor=6),
    _rule("hardswish_mul", _hswish_mul, _hard_swish, three=3, zero=0, six=6, sixth=1 / 6),
    _rule("hardswish_x_hsig", _x_times_hsig, _hard_swish),
    _rule("hardsigmoid_div", _hsig_div, _hard_sigmoid, three=3, zero=0, six=6, divisor=6),
    _rule("hardsigmoid_mul", _hsig_mul, _hard_sigmoid, three=3, zero=0, six=6, sixth=1 / 6),
    _rule("hardsigmoid_inner_div", _hsig_inner_div, _hard_sigmoid, three=3, divisor=6, zero=0, one=1),
    _rule("hardsigmoid_affine", _hsig_affine, _hard_sigmoid, sixth=1 / 6, half=0.5, zero=0, one=1),
    _rule("silu", _x_sigmoid, _silu),
    _rule("relu6_min_max", _min_max, _clip06, zero=0, six=6),
    _rule("relu6_max_min", _max_min, _clip06, zero=0, six=6),
    _rule("relu6_relu_min", _relu_min, _clip06, six=6),
]
