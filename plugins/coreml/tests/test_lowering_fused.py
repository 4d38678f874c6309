"""Lowerings of the fused edgebuild:: ops (Linear, Silu, Gelu, ScaledDotProductAttention)
against their numpy definitions (lowering/ops/fused.py, attention.py).

Each case builds a small ONNX model, lowers it to MIL, runs the program in edgebuild's MIL
interpreter and compares on the same random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_cases import assert_matches, lower, lower_and_run, rand, single_node_model

RTOL, ATOL = 1e-4, 1e-5


def _program_ops(result):
    return [op.op_type for op in result.program.functions["main"].operations]


def _fused_model(op, inputs, *, attrs=None, initializers=()):
    model = single_node_model(op, inputs, attrs=attrs, domain="edgebuild", initializers=initializers)
    return model


def test_fused_linear_silu_gelu():
    x, w, b = rand(2, 3, 6), rand(6, 5, seed=1), rand(5, seed=2)
    for const in (True, False):
        model = _fused_model("Linear", {"x": x, "w": w, "b": b}, initializers=("w", "b") if const else ())
        feeds = {"x": x} if const else {"x": x, "w": w, "b": b}
        assert_matches(lower_and_run(model, feeds)["y"], x @ w + b, rtol=RTOL, atol=ATOL)
    model = _fused_model("Silu", {"x": x})
    assert_matches(lower_and_run(model, {"x": x})["y"], x / (1 + np.exp(-x)), rtol=RTOL, atol=ATOL)
    from math import erf, pi, sqrt

    exact = 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))
    tanh = 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))
    assert_matches(lower_and_run(_fused_model("Gelu", {"x": x}), {"x": x})["y"], exact, rtol=RTOL, atol=ATOL)
    model = _fused_model("Gelu", {"x": x}, attrs={"approximate": "tanh"})
    assert_matches(lower_and_run(model, {"x": x})["y"], tanh, rtol=RTOL, atol=ATOL)


def _attention_reference(q, k, v, mask, scale):
    scores = q @ np.swapaxes(k, -1, -2) * scale + (0 if mask is None else mask)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("target", ["iOS17", "iOS18"])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("with_mask", [False, True])
def test_fused_attention(target, scale, with_mask):
    q, k, v = rand(2, 3, 4, 8), rand(2, 3, 5, 8, seed=1), rand(2, 3, 5, 6, seed=2)
    mask = rand(4, 5, seed=3) if with_mask else None
    model = _fused_model("ScaledDotProductAttention", {"q": q, "k": k, "v": v, "mask": mask},
                         attrs=None if scale is None else {"scale": scale}, initializers=("mask",))
    result = lower(model, target=target)
    assert ("scaled_dot_product_attention" in _program_ops(result)) == (target == "iOS18")
    actual = lower_and_run(model, {"q": q, "k": k, "v": v}, target=target)["y"]
    expected = _attention_reference(q, k, v, mask, 1 / np.sqrt(8) if scale is None else scale)
    assert_matches(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("target", ["iOS17", "iOS18"])
@pytest.mark.parametrize("mask_shape", [None, (4, 5), (1, 1, 4, 5), (2, 6, 4, 5)])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_attention_shares_kv_heads(target, mask_shape, kv_heads):
    """6 query heads on 2 K/V heads (or 1: multi-query): no tile/repeat of K/V in the program,
    numbers as with repeated K/V."""
    q, k, v = rand(2, 6, 4, 8), rand(2, kv_heads, 5, 8, seed=1), rand(2, kv_heads, 5, 8, seed=2)
    mask = None if mask_shape is None else rand(*mask_shape, seed=3)
    model = _fused_model("ScaledDotProductAttention", {"q": q, "k": k, "v": v, "mask": mask},
                         attrs={"scale": 0.3}, initializers=("mask",))
    ops = _program_ops(lower(model, target=target))
    assert "tile" not in ops or mask_shape in ((4, 5), (1, 1, 4, 5))  # only the small mask may be tiled
    assert ("scaled_dot_product_attention" in ops) == (target == "iOS18")
    actual = lower_and_run(model, {"q": q, "k": k, "v": v}, target=target)["y"]
    repeated_k, repeated_v = np.repeat(k, 6 // kv_heads, axis=1), np.repeat(v, 6 // kv_heads, axis=1)
    assert_matches(actual, _attention_reference(q, repeated_k, repeated_v, mask, 0.3), rtol=RTOL, atol=ATOL)


def test_swiglu():
    gate, up = rand(2, 3, 8), rand(2, 3, 8, seed=1)
    model = _fused_model("SwiGLU", {"gate": gate, "up": up})
    assert _program_ops(lower(model)).count("silu") == 1
    expected = gate / (1 + np.exp(-gate)) * up
    assert_matches(lower_and_run(model, {"gate": gate, "up": up})["y"], expected, rtol=RTOL, atol=ATOL)
