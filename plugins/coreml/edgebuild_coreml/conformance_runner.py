"""Runs one ONNX backend node test case through the Core ML lowering and the MIL interpreter.

This is the Core ML side of ``edgebuild conformance``: the core collects the cases and
compares outputs; this module only turns (model, inputs) into outputs, the way a built
``.mlpackage`` would compute them (iOS18 target, float32 compute).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from edgebuild.errors import BuildError

TARGET = "iOS18"
PRECISION = "float32"

_FEED_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}


def _registry():
    """The installed plugins' registry (the one ``edgebuild run`` lowers with)."""
    from edgebuild.registry import get_registry

    return get_registry()


def _feed(value: np.ndarray, mil_dtype: str) -> np.ndarray:
    """``value`` as the Core ML input would carry it: int64 -> int32, float64 -> float32,
    bool -> int32; rank-0 values go in as shape (1,)."""
    feed = np.asarray(value).astype(_FEED_DTYPES[mil_dtype])
    return feed.reshape(1) if feed.ndim == 0 else feed


def run_onnx_case(model_proto: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Lower ``model_proto`` and interpret it on ``inputs`` (in graph input order).

    Returns one array per graph output, in graph output order. Lowering problems raise the
    converter's edgebuild errors unchanged (unsupported op -> BuildError, LoweringError).
    """
    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    model = ir.serde.deserialize_model(model_proto)
    initializer_names = set(model.graph.initializers)
    graph_inputs = [v.name for v in model.graph.inputs if v.name not in initializer_names]
    if len(inputs) != len(graph_inputs):
        raise BuildError(
            f"the case feeds {len(inputs)} inputs but the model has {len(graph_inputs)} ({', '.join(graph_inputs)})"
        )
    values = dict(zip(graph_inputs, inputs))
    result = convert(model, target=TARGET, precision=PRECISION, registry=_registry())
    feeds = {
        mil_name: _feed(values[onnx_name], result.input_dtypes[mil_name])
        for onnx_name, mil_name in result.input_names.items()
    }
    produced = run_program(result.program, feeds)
    return [np.asarray(produced[mil_name]) for mil_name in result.output_names.values()]
