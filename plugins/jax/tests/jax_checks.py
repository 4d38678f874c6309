"""Test helpers: a JAX function exported, converted to ONNX, and run three ways — JAX (the truth),
onnxruntime on the converted graph, and the Core ML lowering in edgebuild's MIL interpreter."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy


def export(fn, *args):
    """``jax.export`` of ``fn`` for the shapes and dtypes of ``args`` (arrays or ShapeDtypeStructs)."""
    from jax import export as jax_export

    specs = [a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
             for a in args]
    return jax_export.export(jax.jit(fn))(*specs)


def to_onnx(exported, *, input_names=None, output_names=None):
    """The converted ``onnx.ModelProto`` of an ``Exported``."""
    import onnx_ir as ir

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(bytes(exported.mlir_module_serialized), context, origin="test.jaxexport")
    with context:
        model = convert_module(module, origin="test", input_names=input_names, output_names=output_names)
    return ir.serde.serialize_model(model)


def run_onnxruntime(model, arrays):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays)))


def run_lowered(model, arrays):
    """The Core ML lowering of ``model`` run by edgebuild's MIL interpreter."""
    from edgebuild.registry import get_registry

    runner = get_registry().get("backends", "coreml").conformance_runner()
    return runner.run(model, list(arrays))


def assert_converts(fn, *args, rtol=1e-5, atol=1e-5, lowered=True, lowered_tol=None):
    """``fn(*args)`` exported and converted must match JAX on onnxruntime and, when ``lowered``,
    in the MIL interpreter (``lowered_tol``: (rtol, atol) for that run, default the same).
    Returns the ONNX model."""
    arrays = [np.asarray(a) for a in args]
    exported = export(fn, *arrays)
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]
    model = to_onnx(exported)
    got = run_onnxruntime(model, arrays)
    _compare(got, want, "onnxruntime", rtol, atol)
    if lowered:
        lrtol, latol = lowered_tol or (rtol, atol)
        _compare(run_lowered(model, arrays), want, "the Core ML lowering", lrtol, latol)
    return model


def _compare(got, want, what, rtol, atol):
    __tracebackhide__ = True
    assert len(got) == len(want), f"{what}: {len(got)} outputs, JAX has {len(want)}"
    for index, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what}, output {index}: shape {g.shape}, JAX's {w.shape}"
        if w.dtype == bool or w.dtype.kind in "iu":
            assert np.array_equal(g.astype(w.dtype), w), f"{what}, output {index}: {g} != {w}"
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                       err_msg=f"{what}, output {index}")


def symbolic(shape: str, dtype=np.float32):
    """A ShapeDtypeStruct with symbolic dims, e.g. ``symbolic("b, 16")``."""
    from jax import export as jax_export

    return jax.ShapeDtypeStruct(jax_export.symbolic_shape(shape), dtype)


def pinned(model, arrays):
    """A copy of ``model`` whose inputs have the concrete shapes of ``arrays``."""
    import onnx
    import onnx_ir as ir

    copy = ir.serde.deserialize_model(onnx.ModelProto.FromString(model.SerializeToString()))
    for value, array in zip(copy.graph.inputs, arrays):
        value.shape = ir.Shape(np.shape(array))
    return ir.serde.serialize_model(copy)


def assert_converts_dynamic(fn, specs, cases, *, rtol=1e-5, atol=1e-5, lowered=True, lowered_tol=None):
    """``fn`` exported once for ``specs`` (symbolic shapes) and converted once; on every case (a
    list of arrays, each case at other concrete sizes) onnxruntime must match JAX's
    ``exported.call``. When ``lowered``, the Core ML lowering of the model with its inputs pinned
    to the first case's shapes must match too. Returns the ONNX model."""
    from jax import export as jax_export

    exported = jax_export.export(jax.jit(fn))(*specs)
    model = to_onnx(exported)
    dims = [d for value in model.graph.input for d in value.type.tensor_type.shape.dim]
    assert any(d.dim_param for d in dims), "the converted model has no dynamic input dim"
    for arrays in cases:
        arrays = [np.asarray(a) for a in arrays]
        want = [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]
        _compare(run_onnxruntime(model, arrays), want, f"onnxruntime at {[a.shape for a in arrays]}", rtol, atol)
    if lowered:
        arrays = [np.asarray(a) for a in cases[0]]
        want = [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]
        lrtol, latol = lowered_tol or (rtol, atol)
        _compare(run_lowered(pinned(model, arrays), arrays), want, "the Core ML lowering", lrtol, latol)
    return model


def onnx_from_mlir(text: str, origin: str = "test.mlir"):
    """The converted ``onnx.ModelProto`` of a StableHLO module written as MLIR text."""
    import onnx_ir as ir

    from edgebuild_jax.convert.module import convert_module
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(text.encode(), context, origin=origin)
    with context:
        return ir.serde.serialize_model(convert_module(module, origin=origin))
