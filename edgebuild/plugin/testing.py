"""pytest helpers for plugin authors: test a lowering against the op's reference in three lines.

::

    from edgebuild.plugin.testing import assert_lowering_matches, single_op_model

    def test_swish2_lowers_to_core_ml():
        model = single_op_model("Swish2", domain="mydomain", inputs={"X": (2, 8)}, attributes={"beta": 1.5})
        assert_lowering_matches(model, backend="coreml")

The model runs through the backend's ``conformance_runner()`` (:class:`edgebuild.plugin.Backend`:
Core ML lowers it and runs it in edgebuild's MIL interpreter, no Mac needed) and through the
reference validation would use: onnxruntime for standard ops, onnx's reference evaluator with the
registered custom ops' references (``edgebuild_register_custom_ops``) for the others.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from edgebuild.errors import UsageError
from edgebuild.registration import standard_domain
from edgebuild.registry import get_registry

__all__ = ["single_op_model", "random_inputs", "reference_outputs", "assert_lowering_matches"]

IR_VERSION = 10  # read by every onnx and onnxruntime edgebuild supports


def single_op_model(op_type: str, *, domain: str = "", inputs: Mapping[str, Any], outputs: Sequence[str] = ("Y",),
                    attributes: Optional[Mapping[str, Any]] = None, dtype: str = "float32", opset: int = 18,
                    domain_version: int = 1, name: Optional[str] = None):
    """An ``onnx.ModelProto`` of one ``domain::op_type`` node.

    ``inputs`` maps each of the node's inputs, in order, to a shape (a graph input of ``dtype``) or to
    an array (a constant: an initializer, as a weight would be). ``outputs`` names the node's outputs;
    ``attributes`` are set on the node; ``name`` names it (default: ``op_type``)."""
    import onnx
    import onnx.helper as oh

    elem_type = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph_inputs, initializers = [], []
    for input_name, value in inputs.items():
        if isinstance(value, np.ndarray):
            initializers.append(onnx.numpy_helper.from_array(value, input_name))
        else:
            graph_inputs.append(oh.make_tensor_value_info(input_name, elem_type, list(value)))
    node = oh.make_node(op_type, list(inputs), list(outputs), name=name or op_type, domain=domain,
                        **dict(attributes or {}))
    graph = oh.make_graph([node], f"{op_type}_alone", graph_inputs,
                          [oh.make_tensor_value_info(output, elem_type, None) for output in outputs], initializers)
    opsets = [oh.make_opsetid("", opset)]
    if standard_domain(domain):
        opsets.append(oh.make_opsetid(domain, domain_version))
    return oh.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def random_inputs(model, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays for every graph input of ``model`` (initializers excepted), drawn with ``seed``: floats
    from a standard normal, integers from 0..3, booleans at random."""
    import onnx.helper as oh

    rng = np.random.default_rng(seed)
    constants = {tensor.name for tensor in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        shape = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]
        if None in shape:
            raise UsageError(f"input {value.name!r} of the model has a symbolic dimension ({shape})",
                             hint="give it a concrete shape, or pass the arrays with inputs=")
        dtype = np.dtype(oh.tensor_dtype_to_np_dtype(tensor.elem_type))
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.random(shape) < 0.5
    return feeds


def reference_outputs(model, inputs: Mapping[str, np.ndarray], *, registry=None) -> tuple[dict[str, np.ndarray], str]:
    """What validation's reference computes for ``model`` on ``inputs``, and which reference it is
    ("onnxruntime", "onnx reference evaluator + mydomain::Swish2 (edgebuild-swish 0.1.0)").

    A custom op without a registered reference raises the error a build would: it names the op,
    the plugin that lowers it and how to register one."""
    import onnx

    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.verify.reference import choose_reference

    registry = registry or get_registry()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(model, str(path))
        reference = choose_reference(path, registry, fmt="onnx", inputs={}, options=None, base_dir=Path(folder),
                                     section=ValidateSection())
        return reference.runner(dict(inputs)), reference.name


def assert_lowering_matches(model, backend: str = "coreml", *, inputs: Optional[Mapping[str, np.ndarray]] = None,
                            seed: int = 0, rtol: float = 1e-4, atol: float = 1e-4, cosine: Optional[float] = None,
                            registry=None) -> dict[str, np.ndarray]:
    """Run ``model`` through ``backend``'s lowering and assert each output matches the reference's.

    ``inputs`` default to :func:`random_inputs` drawn with ``seed``. Each output must be within
    ``rtol``/``atol`` of the reference elementwise and, when ``cosine`` is given, have at least that
    cosine similarity with it. Returns the backend's outputs by name. ``registry`` defaults to the
    installed plugins' (the one ``edgebuild run`` uses)."""
    registry = registry or get_registry()
    lowering = registry.get("backends", backend)
    if lowering is None:
        raise UsageError(f"no backend {backend!r} is installed (there are: {', '.join(registry.names('backends'))})",
                         hint="install its plugin, or name an installed backend")
    runner = lowering.conformance_runner()
    if runner is None:
        raise UsageError(f"backend {backend!r} runs no single models (its conformance_runner() is None)",
                         hint="test the lowering through a built artifact, or with a backend that has a runner")
    feeds = dict(inputs) if inputs is not None else random_inputs(model, seed=seed)
    constants = {tensor.name for tensor in model.graph.initializer}
    ordered = [feeds[value.name] for value in model.graph.input if value.name not in constants]
    produced = runner.run(model, ordered)  # first: a lowering's own error is the one its author needs
    expected, reference = reference_outputs(model, feeds, registry=registry)
    names = [value.name for value in model.graph.output]
    ops = ", ".join(sorted({f"{node.domain}::{node.op_type}" if standard_domain(node.domain) else node.op_type
                            for node in model.graph.node}))
    for name, got in zip(names, produced):
        _compare(np.asarray(got), np.asarray(expected[name]), f"{ops} lowered by {backend!r}, output {name!r}, "
                 f"against {reference}", rtol=rtol, atol=atol, cosine=cosine)
    return dict(zip(names, (np.asarray(got) for got in produced)))


def _compare(got: np.ndarray, want: np.ndarray, what: str, *, rtol: float, atol: float,
             cosine: Optional[float]) -> None:
    __tracebackhide__ = True  # pytest shows the caller's line
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, the reference's {want.shape}")
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.allclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True):
        worst = float(np.max(np.abs(got64 - want64)))
        raise AssertionError(f"{what}: max |difference| {worst:.3g} exceeds atol {atol:g} + rtol {rtol:g} "
                             f"of the reference")
    if cosine is not None:
        norms = float(np.linalg.norm(got64) * np.linalg.norm(want64))
        similarity = float(np.dot(got64.ravel(), want64.ravel()) / norms) if norms else 1.0
        if similarity < cosine:
            raise AssertionError(f"{what}: cosine similarity {similarity:.6f} < {cosine}")
