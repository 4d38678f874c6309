"""The ONNX schema of com.example::RMSNorm (so onnx.checker and shape inference know it)."""

from __future__ import annotations

import onnx
from onnx.defs import OpSchema

from edgebuild_example_ops import DOMAIN, OP_TYPE

RMS_NORM_SCHEMA = OpSchema(
    OP_TYPE, DOMAIN, 1,
    doc="Y = X / sqrt(mean(X^2, axis=-1) + epsilon) * scale, normalising over the last axis.",
    inputs=[OpSchema.FormalParameter("X", "T", "input, [..., D]"),
            OpSchema.FormalParameter("scale", "T", "per-channel gain, [D]")],
    outputs=[OpSchema.FormalParameter("Y", "T", "same shape as X")],
    type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float tensors")],
    attributes=[OpSchema.Attribute("epsilon", OpSchema.AttrType.FLOAT, "added to the mean square", required=False)],
)


def register_schema() -> None:
    """Make the schema known to onnx in this process (idempotent)."""
    if not onnx.defs.has(OP_TYPE, DOMAIN):
        onnx.defs.register_schema(RMS_NORM_SCHEMA)
