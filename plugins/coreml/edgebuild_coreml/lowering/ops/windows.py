"""Window functions (HannWindow, HammingWindow, BlackmanWindow): constants of a constant size."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from edgebuild_coreml.lowering.registry import lowers


def _cosine_terms(op_type: str) -> list[float]:
    """Coefficients a_k of ``sum_k (-1)^k a_k cos(2 pi k n / D)``."""
    if op_type == "HannWindow":
        return [0.5, 0.5]
    if op_type == "HammingWindow":
        return [25.0 / 46.0, 21.0 / 46.0]
    return [0.42, 0.5, 0.08]


@lowers("HannWindow", "HammingWindow", "BlackmanWindow", since=17)
def window(ctx, node):
    size = int(np.asarray(ctx.const(node, 0, what="size")).reshape(-1)[0])
    if size < 1:
        ctx.fail(node, f"size {size} makes an empty window, which Core ML cannot hold")
    periodic = bool(ctx.attr(node, "periodic", 1))
    denominator = size if periodic else max(size - 1, 1)
    n = np.arange(size, dtype=np.float64)
    values = sum((-1) ** k * a * np.cos(2 * np.pi * k * n / denominator)
                 for k, a in enumerate(_cosine_terms(node.op_type)))
    return np.asarray(values).astype(ir.DataType(ctx.attr(node, "output_datatype", 1)).numpy())
