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
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion_rules._values import (
    EDGEBUILD_DOMAIN,
    const_array,
    is_scalar,
    new_initializer,
)

MIN_OPSET = 14  # HardSwish
SQRT_2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _scalars(**expected: float):
    """A rule condition: each named binding is a constant close to the expected number."""

    def check(context, **bindings) -> bool:
        return all(is_scalar(bindings.get(name), value) for name, value in expected.items())

    return check


def _rules(name: str, target, replacement, commute: bool = True, **expected: float) -> list[pattern.RewriteRule]:
    """The rule, plus its operand-swapped variants when ``commute`` (small patterns only)."""
    rule = pattern.RewriteRule(target, replacement, _scalars(**expected), name=name)
    return list(rule.commute()) if commute else [rule]


def _gelu_products(op, x, half, cdf):
    """The spellings of x * 0.5 * cdf once constants sit on the right of Mul/Add.

    Full commutation of the GELU patterns gives thousands of variants; the pass moves
    constants right first (see :func:`constants_to_the_right`), leaving these six.
    """
    return [
        op.Mul(op.Mul(x, half), cdf),
        op.Mul(cdf, op.Mul(x, half)),
        op.Mul(op.Mul(x, cdf), half),
        op.Mul(op.Mul(cdf, x), half),
        op.Mul(x, op.Mul(cdf, half)),
        op.Mul(op.Mul(cdf, half), x),
    ]


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
        return _gelu_products(op, x, half, cdf)[bracketing]

    return target


def _tanh_gelu_target(cube, x_first: bool, bracketing: int):
    def target(op, x, three, a, c, one, half):
        cubic = op.Mul(cube(op, x, three), a)
        inner = op.Mul(op.Add(x, cubic) if x_first else op.Add(cubic, x), c)
        cdf = op.Add(op.Tanh(inner), one)
        return _gelu_products(op, x, half, cdf)[bracketing]

    return target


def _erf_gelu_patterns():
    """0.5 * x * (1 + erf(x / sqrt2)), with the inner scaling as Div or Mul."""
    inner_forms = {"div": lambda op, x, k: op.Div(x, k), "mul": lambda op, x, k: op.Mul(x, k)}
    patterns = []
    for inner_name, inner in inner_forms.items():
        for bracketing in range(6):
            target = _erf_gelu_target(inner, bracketing)
            expected = {"k": SQRT_2 if inner_name == "div" else 1 / SQRT_2, "one": 1.0, "half": 0.5}
            patterns.append((f"gelu_erf_{inner_name}_{bracketing}", target, expected))
    return patterns


def _tanh_gelu_patterns():
    """0.5 * x * (1 + tanh(c * (x + 0.044715 * x^3))), x^3 as Pow or Mul(Mul(x, x), x)."""
    cube_forms = {
        "pow": lambda op, x, three: op.Pow(x, three),
        "mul": lambda op, x, three: op.Mul(op.Mul(x, x), x),
        "mul2": lambda op, x, three: op.Mul(x, op.Mul(x, x)),
    }
    patterns = []
    for cube_name, cube in cube_forms.items():
        for x_first in (True, False):
            for bracketing in range(6):
                target = _tanh_gelu_target(cube, x_first, bracketing)
                expected = {"a": 0.044715, "c": SQRT_2_OVER_PI, "one": 1.0, "half": 0.5}
                if cube_name == "pow":
                    expected["three"] = 3.0
                patterns.append((f"gelu_tanh_{cube_name}_{int(x_first)}_{bracketing}", target, expected))
    return patterns


def _gelu(approximate: str):
    def replacement(op, x, **_):
        return op.Gelu(x, approximate=approximate, _domain=EDGEBUILD_DOMAIN)

    return replacement


def constants_to_the_right(model: ir.Model) -> None:
    """Put the constant operand of every Add/Mul second, so patterns need one spelling."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type in ("Add", "Mul") and node.domain in ("", "ai.onnx") and len(node.inputs) == 2:
            first, second = node.inputs
            if const_array(first) is not None and const_array(second) is None:
                node.replace_input_with(0, second)
                node.replace_input_with(1, first)


def rules() -> list[pattern.RewriteRule]:
    return [
        # GELU and HardSwish first: their patterns contain the smaller ones.
        *[r for name, target, expected in _erf_gelu_patterns() for r in _rules(name, target, _gelu("none"), False, **expected)],
        *[r for name, target, expected in _tanh_gelu_patterns() for r in _rules(name, target, _gelu("tanh"), False, **expected)],
        *_rules("hardswish_div", _hswish_div, _hard_swish, three=3, zero=0, six=6, divisor=6),
        *_rules("hardswish_mul", _hswish_mul, _hard_swish, three=3, zero=0, six=6, sixth=1 / 6),
        *_rules("hardswish_x_hsig", _x_times_hsig, _hard_swish),
        *_rules("hardsigmoid_div", _hsig_div, _hard_sigmoid, three=3, zero=0, six=6, divisor=6),
        *_rules("hardsigmoid_mul", _hsig_mul, _hard_sigmoid, three=3, zero=0, six=6, sixth=1 / 6),
        *_rules("hardsigmoid_inner_div", _hsig_inner_div, _hard_sigmoid, three=3, divisor=6, zero=0, one=1),
        *_rules("hardsigmoid_affine", _hsig_affine, _hard_sigmoid, sixth=1 / 6, half=0.5, zero=0, one=1),
        *_rules("silu", _x_sigmoid, _silu),
        *_rules("relu6_min_max", _min_max, _clip06, zero=0, six=6),
        *_rules("relu6_max_min", _max_min, _clip06, zero=0, six=6),
        *_rules("relu6_relu_min", _relu_min, _clip06, six=6),
    ]
