"""The Metal kernel of RMSNorm, declared for edgebuild-msl (float32; rows of the last axis)."""

from __future__ import annotations

import math
from pathlib import Path

from edgebuild_msl import ConstantBinding, KernelSpec, TensorDecl

from edgebuild_example_ops import DOMAIN, OP_TYPE
from edgebuild_example_ops.reference import rms_norm

THREADS = 128  # per row; a multiple of the 32-wide SIMD-group


def rms_norm_kernel() -> KernelSpec:
    from edgebuild_example_ops.schema import RMS_NORM_SCHEMA

    def rows(shapes):
        return math.prod(shapes["X"][:-1])

    return KernelSpec(
        domain=DOMAIN, op_type=OP_TYPE, description="RMS normalisation over the last axis",
        inputs=[TensorDecl("X", "float32"), TensorDecl("scale", "float32", 1)],
        outputs=[TensorDecl("Y", "float32")],
        attributes={"epsilon": 1e-6},
        source=Path(__file__).with_name("rms_norm.metal"), entry="rms_norm",
        buffers={"X": 0, "scale": 1, "Y": 2},
        constants=[ConstantBinding("d", 3, "uint", lambda s: s["X"][-1]),
                   ConstantBinding("epsilon", 4, "float", "epsilon")],
        grid=lambda s: (rows(s) * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=lambda s: {"Y": s["X"]},
        reference=rms_norm, schema=RMS_NORM_SCHEMA,
        example_shapes={"X": (4, 96), "scale": (96,)},
    )
