"""Numpy references for the ``edgebuild::`` ops the fusion passes emit.

onnxruntime cannot run these ops, so tests and validation evaluate fused models with
``onnx.reference.ReferenceEvaluator`` plus the implementations below. Each function is the
op's definition (the kernels themselves live in :mod:`edgebuild.reference`, shared with
every executor); backends must match it.

Op definitions (domain ``edgebuild``, version 1):

- ``Linear(X, W, B?)``: ``X @ W + B``; ``W`` is ``[in, out]`` (MatMul layout), ``B`` is ``[out]``.
- ``Silu(X)``: ``X * sigmoid(X)``.
- ``Gelu(X, approximate="none"|"tanh")``: exact erf form or the tanh approximation.
- ``ScaledDotProductAttention(Q, K, V, mask?, scale: float, q_heads?: int, kv_heads?: int)``:
  ``softmax(Q @ swapaxes(K, -1, -2) * scale + mask, axis=-1) @ V``; ``K`` is ``[..., Lk, D]``.
  K/V may have fewer heads (axis -3) than Q, a divisor ``Hkv`` of its ``H``: query head ``h``
  then uses K/V head ``h // (H / Hkv)`` (grouped-query attention, no repeated copies);
  ``q_heads`` / ``kv_heads`` state H and Hkv for backends that cannot infer them.
- ``SwiGLU(gate, up)``: ``silu(gate) * up`` (the gated MLP's activation).

onnxruntime's ``SimplifiedLayerNormalization`` (RMS normalisation, ONNX domain) has a reference
here too: onnx's evaluator does not know it.
"""

from __future__ import annotations

from os import PathLike

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from edgebuild.reference import activations
from edgebuild.reference.activations import silu, swiglu
from edgebuild.reference.attention import scaled_dot_product_attention
from edgebuild.reference.normalization import rms_normalization

DOMAIN = "edgebuild"


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = np.matmul(x, w)
    return y if b is None else y + b


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return activations.gelu(x, approximate)


# ---- onnx.reference glue ------------------------------------------------------------------


class Linear(OpRun):
    op_domain = DOMAIN

    def _run(self, x, w, b=None):
        return (linear(x, w, b),)


class Silu(OpRun):
    op_domain = DOMAIN

    def _run(self, x):
        return (silu(x),)


class Gelu(OpRun):
    op_domain = DOMAIN

    def _run(self, x, approximate="none"):
        return (gelu(x, approximate),)


class ScaledDotProductAttention(OpRun):
    op_domain = DOMAIN

    def _run(self, q, k, v, mask=None, scale=1.0, q_heads=None, kv_heads=None):
        return (scaled_dot_product_attention(q, k, v, mask, scale),)


class SwiGLU(OpRun):
    op_domain = DOMAIN

    def _run(self, gate, up, **_):  # onnx knows a SwiGLU schema elsewhere and links its attributes
        return (swiglu(gate, up),)


class SimplifiedLayerNormalization(OpRun):
    op_domain = ""

    def _run(self, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
        y, inverse_rms = rms_normalization(x, scale, axis, epsilon)
        return y, inverse_rms


class DequantizeLinear(OpRun):
    """ai.onnx DequantizeLinear for opsets 13-18, which onnx's evaluator only has from 19."""

    op_domain = ""

    def _run(self, x, scale, zero_point=None, axis=1, block_size=None, output_dtype=None):
        zp = np.zeros_like(scale, dtype=x.dtype) if zero_point is None else zero_point
        if scale.ndim == 1 and scale.size > 1:  # per axis
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return (((x.astype(np.float32) - zp.astype(np.float32)) * scale).astype(scale.dtype),)


REFERENCE_OPS: list[type[OpRun]] = [Linear, Silu, Gelu, ScaledDotProductAttention, SwiGLU,
                                    SimplifiedLayerNormalization, DequantizeLinear]


def run_reference(
    model: ir.Model | onnx.ModelProto | str | PathLike, feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Evaluate a (possibly fused) model with onnx's reference evaluator and these ops."""
    if isinstance(model, ir.Model):
        model = ir.to_proto(model)
    elif not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))  # resolves external data next to the file
    evaluator = ReferenceEvaluator(model, new_ops=REFERENCE_OPS)
    outputs = evaluator.run(None, feeds)
    return {o.name: r for o, r in zip(model.graph.output, outputs)}
