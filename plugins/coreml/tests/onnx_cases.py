"""Helpers for lowering tests: build small ONNX models, lower them, run both sides, compare.

    model = single_node_model("Add", {"a": a, "b": b})
    check(model, {"a": a, "b": b})            # lowered program vs onnxruntime

The lowered program runs in edgebuild's MIL interpreter (Core ML cannot run on Linux).
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

IR_VERSION = 10  # what the installed onnxruntime reads

# onnxruntime's x86 kernel for uint8 x int8 products on CPUs without VNNI (AVX2 only: most AMD and
# older Intel parts) sums pairs of products in int16 with saturation, so a pair beyond 32767 comes
# out wrong and the reference depends on the CPU. int8 operands of such products are drawn in 7 bits
# (what quantize_dynamic's reduce_range writes for the same reason): every pair fits, on any CPU.
INT8_EXACT_RANGE = (-64, 64)


def int8_weights(shape, seed=0) -> np.ndarray:
    """Seeded int8 test weights in :data:`INT8_EXACT_RANGE`."""
    return np.random.default_rng(seed).integers(*INT8_EXACT_RANGE, shape).astype(np.int8)


def rand(*shape, seed=0, low=-1.0, high=1.0) -> np.ndarray:
    """Seeded uniform float32 test data: the same numbers every run."""
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def single_node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray | None],
    *,
    outputs: int | Sequence[str] = 1,
    attrs: Mapping | None = None,
    opset: int = 18,
    initializers: Sequence[str] = (),
    domain: str = "",
    node_name: str = "node",
) -> onnx.ModelProto:
    """A one-node model. ``inputs`` maps input name -> example array (None: omitted optional
    input, passed as ""); names in ``initializers`` become initializers (constants) instead
    of graph inputs. Output types come from ONNX shape inference."""
    output_names = [f"y{i}" if outputs != 1 else "y" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    node_inputs = [name if array is not None else "" for name, array in inputs.items()]
    node = oh.make_node(op_type, node_inputs, output_names, name=node_name, domain=domain, **(attrs or {}))
    graph_inputs, inits = [], []
    for name, array in inputs.items():
        if array is None:
            continue
        array = np.asarray(array)
        if name in initializers:
            inits.append(onh.from_array(array, name))
        else:
            graph_inputs.append(oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    graph = oh.make_graph([node], "case", graph_inputs, [onnx.ValueInfoProto(name=n) for n in output_names], inits)
    opsets = [oh.make_opsetid("", opset)] + ([oh.make_opsetid(domain, 1)] if domain else [])
    model = oh.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def feeds_of(inputs: Mapping[str, np.ndarray | None], initializers: Sequence[str] = ()) -> dict:
    """The runtime feeds for :func:`single_node_model`'s inputs (drops constants and Nones)."""
    return {k: np.asarray(v) for k, v in inputs.items() if v is not None and k not in initializers}


def run_onnxruntime(model_proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference outputs {ONNX output name: array} from onnxruntime's CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs))))


@functools.lru_cache(maxsize=1)
def coreml_registry():
    """A registry holding only this plugin's lowerings (unaffected by other installed plugins)."""
    import pluggy
    from edgebuild import hookspecs
    from edgebuild.registry import Registry

    import edgebuild_coreml
    from edgebuild_coreml import plugin

    manager = pluggy.PluginManager("edgebuild")
    manager.add_hookspecs(hookspecs)
    manager.register(plugin, name="coreml")
    registry = Registry()
    registry.collect(manager, {"coreml": ("edgebuild-coreml", edgebuild_coreml.__version__)})
    return registry


def lower(model_proto: onnx.ModelProto, *, target: str = "iOS18", precision: str = "float32", input_shapes=None):
    """The ConvertResult of lowering ``model_proto`` with the installed plugins' lowerings."""
    from edgebuild_coreml.lowering.converter import convert

    model = ir.serde.deserialize_model(model_proto)
    return convert(model, target=target, precision=precision, input_shapes=input_shapes, registry=coreml_registry())


def lower_and_run(
    model_proto: onnx.ModelProto,
    inputs: Mapping[str, np.ndarray],
    *,
    target: str = "iOS18",
    precision: str = "float32",
) -> dict[str, np.ndarray]:
    """Lower the model, run the MIL program in the interpreter; outputs keyed by ONNX name.

    Inputs are cast the way the Core ML model's inputs are (int64 -> int32, float64 ->
    float32, bool -> int32).
    """
    from edgebuild_coreml.interpreter import run_program

    result = lower(model_proto, target=target, precision=precision)
    feeds = {}
    for onnx_name, mil_name in result.input_names.items():
        dtype = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32, "bool": np.bool_}[result.input_dtypes[mil_name]]
        feed = np.asarray(inputs[onnx_name]).astype(dtype)
        feeds[mil_name] = feed.reshape(1) if feed.ndim == 0 else feed  # scalars go in as shape (1,)
    produced = run_program(result.program, feeds, fp16=precision == "float16")
    return {onnx_name: np.asarray(produced[mil_name]) for onnx_name, mil_name in result.output_names.items()}


def assert_matches(actual: np.ndarray, expected: np.ndarray, *, rtol: float = 1e-5, atol: float = 1e-6, name: str = "") -> None:
    """Same shape, values equal up to tolerance; integer/bool results must match exactly.

    int64 references compare against int32 results (Core ML has no int64)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != expected {expected.shape}"
    if expected.dtype.kind in "biu" or expected.dtype.name in ("int2", "uint2", "int4", "uint4"):  # ml_dtypes
        assert actual.dtype.kind in "biu", f"{name}: dtype {actual.dtype} where {expected.dtype} is expected"
        np.testing.assert_array_equal(actual.astype(np.int64), expected.astype(np.int64), err_msg=name)
    else:
        assert actual.dtype.kind == "f", f"{name}: dtype {actual.dtype} where {expected.dtype} is expected"
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, err_msg=name)


def check(
    model_proto: onnx.ModelProto,
    inputs: Mapping[str, np.ndarray | None],
    *,
    initializers: Sequence[str] = (),
    rtol: float = 1e-5,
    atol: float = 1e-6,
    target: str = "iOS18",
    precision: str = "float32",
) -> dict[str, np.ndarray]:
    """Lower and run ``model_proto``, compare every output with onnxruntime's; returns ours."""
    feeds = feeds_of(inputs, initializers)
    expected = run_onnxruntime(model_proto, feeds)
    actual = lower_and_run(model_proto, feeds, target=target, precision=precision)
    _assert_outputs_match(actual, expected, rtol=rtol, atol=atol)
    return actual


def check_reference(model_proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray | None], *,
                    initializers: Sequence[str] = (), rtol: float = 1e-5, atol: float = 1e-6) -> dict[str, np.ndarray]:
    """:func:`check` against onnx's reference evaluator, where onnxruntime lacks the op or variant."""
    feeds = feeds_of(inputs, initializers)
    names = [o.name for o in model_proto.graph.output]
    expected = dict(zip(names, ReferenceEvaluator(model_proto).run(None, feeds)))
    actual = lower_and_run(model_proto, feeds)
    _assert_outputs_match(actual, expected, rtol=rtol, atol=atol)
    return actual


def _assert_outputs_match(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], *,
                          rtol: float, atol: float) -> None:
    for name, reference in expected.items():
        assert_matches(actual[name], reference, rtol=rtol, atol=atol, name=name)


def check_op(op_type: str, inputs: Mapping[str, np.ndarray | None], *, attrs=None, opset: int = 18, outputs=1,
             initializers: Sequence[str] = (), rtol: float = 1e-5, atol: float = 1e-6, target: str = "iOS18"):
    """:func:`check` on :func:`single_node_model` — the one-liner most op tests need."""
    model = single_node_model(op_type, inputs, outputs=outputs, attrs=attrs, opset=opset, initializers=initializers)
    return check(model, inputs, initializers=initializers, rtol=rtol, atol=atol, target=target)


# -- op tables: {id: (op, inputs, attrs, initializer names, opset, outputs)} -----------------
X = np.random.default_rng(7).standard_normal((2, 3, 4)).astype(np.float32)  # their sample input


def I64(*values) -> np.ndarray:  # noqa: N802 - reads like a dtype in the tables
    return np.array(values, dtype=np.int64)


def op_table_test(cases: Mapping[str, tuple]):
    """The test of an op table: each case, a one-node model, lowered and run against onnxruntime."""

    @pytest.mark.parametrize("case", sorted(cases))
    def test_matches_onnxruntime(case):
        op, inputs, attrs, initializers, opset, outputs = cases[case]
        check_op(op, inputs, attrs=attrs, initializers=initializers, opset=opset, outputs=outputs, rtol=1e-5, atol=1e-5)

    return test_matches_onnxruntime
