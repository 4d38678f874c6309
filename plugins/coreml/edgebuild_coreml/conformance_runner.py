"""Runs one ONNX backend node test case through the Core ML lowering and the MIL interpreter.

This is the Core ML side of ``edgebuild conformance``: the core collects the cases and
compares outputs; this module only turns (model, inputs) into outputs, the way a built
``.mlpackage`` would compute them (iOS18 target, float32 compute).

The cases feed operator parameters (axes, pads, scales, k, weights) as graph inputs, which
MIL takes only as build-time constants. When the lowering asks for a constant, the case is
lowered again with every input but the first baked in as an initializer — what a recipe's
fixed input (``source.inputs: {name: {value: ...}}``) does — and run on the first input;
failing that, with every input baked in. Core ML inputs cannot be empty, so a zero-size input
is only ever baked in, and a case whose data (first) input is empty is not representable.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

from edgebuild.plugin import BuildError, ConformanceRunner, NotRepresentable
from edgebuild.plugin.graph import EMPTY_TENSORS

TARGET = "iOS18"
PRECISION = "float32"

_FEED_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}


def _registry():
    """The installed plugins' registry (the one ``edgebuild run`` lowers with)."""
    from edgebuild.plugin import get_registry

    return get_registry()


def _feed(value: np.ndarray, mil_dtype: str) -> np.ndarray:
    """``value`` as the Core ML input would carry it: int64 -> int32, float64 -> float32,
    bool -> int32; rank-0 values go in as shape (1,)."""
    feed = np.asarray(value).astype(_FEED_DTYPES[mil_dtype])
    return feed.reshape(1) if feed.ndim == 0 else feed


def _with_shapes(model_proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with inferred value types (the optimise stage's shape inference does the same)."""
    try:
        return onnx.shape_inference.infer_shapes(model_proto, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a help, not a requirement
        return model_proto


def _fold_inputs(model_proto: onnx.ModelProto, values: dict[str, np.ndarray], names: list[str]) -> onnx.ModelProto:
    """A copy of the model where graph inputs ``names`` are initializers holding ``values``."""
    folded = onnx.ModelProto()
    folded.CopyFrom(model_proto)
    kept = [v for v in folded.graph.input if v.name not in names]
    del folded.graph.input[:]
    folded.graph.input.extend(kept)
    folded.graph.initializer.extend(numpy_helper.from_array(np.asarray(values[n]), n) for n in names)
    return folded


def _wants_constants(exc: BuildError) -> bool:
    """Whether a lowering refused an operand because it is not a build-time constant (or a shape
    derived from a parameter input is not static)."""
    text = str(exc).lower()
    return "constant" in text or "initializer" in text or "static shape" in text


def _lower_and_run(model_proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    model = ir.serde.deserialize_model(_with_shapes(model_proto))
    result = convert(model, target=TARGET, precision=PRECISION, registry=_registry())
    feeds = {
        mil_name: _feed(values[onnx_name], result.input_dtypes[mil_name])
        for onnx_name, mil_name in result.input_names.items()
    }
    produced = run_program(result.program, feeds)
    return [np.asarray(produced[mil_name]) for mil_name in result.output_names.values()]


def run_onnx_case(model_proto: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Lower ``model_proto`` and interpret it on ``inputs`` (in graph input order).

    Returns one array per graph output, in graph output order. Lowering problems raise the
    converter's edgebuild errors unchanged (unsupported op -> BuildError, LoweringError).
    """
    from edgebuild_coreml.lowering.errors import LoweringError

    initializer_names = {t.name for t in model_proto.graph.initializer}
    graph_inputs = [v.name for v in model_proto.graph.input if v.name not in initializer_names]
    if len(inputs) != len(graph_inputs):
        raise BuildError(
            f"the case feeds {len(inputs)} inputs but the model has {len(graph_inputs)} ({', '.join(graph_inputs)})"
        )
    values = dict(zip(graph_inputs, inputs))
    empty = [name for name in graph_inputs if np.asarray(values[name]).size == 0]
    if graph_inputs and graph_inputs[0] in empty:
        raise NotRepresentable(EMPTY_TENSORS)
    # Fold nothing, then the parameters (inputs after the first), then everything; an empty
    # input is always folded.
    attempts = [[], graph_inputs[1:], graph_inputs]
    attempts = [names for names in attempts if set(empty) <= set(names)]
    attempts = [names for i, names in enumerate(attempts) if names not in attempts[:i]]
    for i, folded in enumerate(attempts):
        try:
            return _lower_and_run(_fold_inputs(model_proto, values, folded) if folded else model_proto, values)
        except LoweringError as exc:
            if i == len(attempts) - 1 or not _wants_constants(exc):
                raise
    raise AssertionError("unreachable")


class CoreMLConformanceRunner(ConformanceRunner):
    """What ``CoreMLBackend.conformance_runner()`` returns: :func:`run_onnx_case` and how it runs."""

    notes = (
        "cases are lowered for iOS18 at float32 precision and run in edgebuild's MIL interpreter "
        "(no Mac involved). Operator parameters that MIL takes only as build-time constants (axes, pads, "
        "scales, k, weights) come as graph inputs in these cases; such cases are lowered again with those "
        "inputs folded into initializers, as a recipe's fixed `value:` inputs are. Three cases fail on "
        "purpose (docs/op-notes.md): `test_dft_inverse` and `test_dft_inverse_opset19` expect numpy's "
        "complex64 rounding noise (1.9e-7, over the case's atol) where the lowering computes 3e-15; "
        "`test_maxunpool_export_with_output_shape` follows onnx's reference reading of the indices, "
        "which onnxruntime (the validation reference) and torch do not share."
    )

    def run(self, model, inputs):
        return run_onnx_case(model, inputs)
