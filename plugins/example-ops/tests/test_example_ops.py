"""com.example::RMSNorm: the Metal kernel (CPU emulation) and the Core ML lowering (MIL
interpreter), each against the numpy reference; the plugin registers both."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from edgebuild_example_ops import DOMAIN, OP_TYPE
from edgebuild_example_ops.kernel import rms_norm_kernel
from edgebuild_example_ops.reference import rms_norm

rng = np.random.default_rng(11)


def test_reference_matches_the_formula():
    x, scale = rng.standard_normal((3, 8)), rng.standard_normal(8)
    expected = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(rms_norm(x, scale), expected, rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 301)])  # 301: rows not a multiple of the threads
def test_metal_kernel_matches_reference(shape):
    from edgebuild_msl import compile_kernel

    x = rng.standard_normal(shape).astype(np.float32)
    scale = rng.standard_normal(shape[-1]).astype(np.float32)
    out = compile_kernel(rms_norm_kernel()).run({"X": x, "scale": scale}, {"epsilon": 1e-5})
    np.testing.assert_allclose(out["Y"], rms_norm(x, scale, epsilon=1e-5), rtol=1e-5, atol=1e-5)


def _model(x, scale, epsilon):
    import onnx
    import onnx.helper as oh

    from edgebuild_example_ops.schema import register_schema

    register_schema()
    node = oh.make_node(OP_TYPE, ["X", "scale"], ["Y"], domain=DOMAIN, epsilon=epsilon)
    graph = oh.make_graph([node], "rms", [oh.make_tensor_value_info("X", onnx.TensorProto.FLOAT, x.shape)],
                          [oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, x.shape)],
                          [onnx.numpy_helper.from_array(scale, "scale")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, 1)], ir_version=10)
    onnx.checker.check_model(model)  # the schema is known: attributes and types are checked
    return model


def _registry():
    import pluggy
    from edgebuild import hookspecs
    from edgebuild.registry import Registry
    from edgebuild_coreml import plugin as coreml_plugin

    from edgebuild_example_ops import plugin

    manager = pluggy.PluginManager("edgebuild")
    manager.add_hookspecs(hookspecs)
    manager.register(coreml_plugin, name="coreml")
    manager.register(plugin, name="example_ops")
    registry = Registry()
    registry.collect(manager, {"coreml": ("edgebuild-coreml", "0"), "example_ops": ("edgebuild-example-ops", "0")})
    return registry


@pytest.mark.parametrize("precision,tol", [("float32", 1e-5), ("float16", 3e-2)])
def test_coreml_lowering_matches_reference(precision, tol):
    pytest.importorskip("edgebuild_coreml")
    import onnx_ir as ir
    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    x = rng.standard_normal((2, 5, 48)).astype(np.float32)
    scale = rng.standard_normal(48).astype(np.float32)
    result = convert(ir.serde.deserialize_model(_model(x, scale, 1e-5)), target="iOS17", precision=precision,
                     input_shapes=None, registry=_registry())
    assert result.op_counts.get("reduce_mean") == 1 and result.op_counts.get("rsqrt") == 1  # a decomposition
    feed_dtype = np.float16 if result.input_dtypes[result.input_names["X"]] == "fp16" else np.float32
    produced = run_program(result.program, {result.input_names["X"]: x.astype(feed_dtype)}, fp16=precision == "float16")
    got = np.asarray(produced[result.output_names["Y"]], dtype=np.float32)
    np.testing.assert_allclose(got, rms_norm(x, scale, epsilon=1e-5), rtol=tol, atol=tol)


def test_plugin_registers_kernel_and_lowering():
    registry = _registry()
    spec = registry.get("custom_ops", (DOMAIN, OP_TYPE))
    assert spec.entry == "rms_norm" and spec.schema is not None
    assert registry.lowering("coreml", OP_TYPE, DOMAIN, 18) is not None
