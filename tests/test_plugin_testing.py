"""edgebuild.plugin.testing with no backend plugin installed: a plugin registering ``mydomain::Swish2``
(its reference) and a backend whose conformance runner plays the lowering."""

from __future__ import annotations

import numpy as np
import pytest

from edgebuild.errors import BuildError, UsageError
from edgebuild.plugin import Backend, ConformanceRunner, OpReference, hookimpl
from edgebuild.plugin.testing import assert_lowering_matches, random_inputs, reference_outputs, single_op_model
from edgebuild.registry import build_registry


def swish2(x, *, beta=1.0):
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-beta * x64))).astype(x.dtype)


class NumpyRunner(ConformanceRunner):
    """Computes the one Swish2 node as a lowering would: right, or with beta forgotten."""

    def __init__(self, forget_beta: bool):
        self.forget_beta = forget_beta

    def run(self, model, inputs):
        (node,) = model.graph.node
        beta = 1.0 if self.forget_beta else next(a.f for a in node.attribute if a.name == "beta")
        x = inputs[0].astype(np.float64)
        return [(x / (1.0 + np.exp(-beta * x))).astype(np.float32)]


class NumpyBackend(Backend):
    def __init__(self, runner):
        self.runner = runner

    def stages(self, variant, registry):
        return []

    def conformance_runner(self):
        return self.runner


class SwishPlugin:
    def __init__(self, with_reference: bool = True):
        self.with_reference = with_reference

    @hookimpl
    def edgebuild_register_custom_ops(self, register):
        if self.with_reference:
            register("mydomain", "Swish2", OpReference("mydomain", "Swish2", reference=swish2, attributes={"beta": 1.0}))

    @hookimpl
    def edgebuild_register_backends(self, register):
        register("numpy_right", NumpyBackend(NumpyRunner(forget_beta=False)))
        register("numpy_wrong", NumpyBackend(NumpyRunner(forget_beta=True)))
        register("no_runner", NumpyBackend(None))


@pytest.fixture
def registry():
    return build_registry({"swish": SwishPlugin()})


def _model():
    return single_op_model("Swish2", domain="mydomain", inputs={"X": (2, 8)}, attributes={"beta": 1.5})


def test_three_lines_pass_for_a_right_lowering(registry):
    outputs = assert_lowering_matches(_model(), backend="numpy_right", registry=registry, cosine=0.9999)
    assert outputs["Y"].shape == (2, 8)


def test_a_wrong_lowering_fails_naming_the_op_the_output_and_the_reference(registry):
    with pytest.raises(AssertionError, match=r"mydomain::Swish2 lowered by 'numpy_wrong', output 'Y', against onnx "
                                             r"reference evaluator \+ mydomain::Swish2 \(swish.*max \|difference\|"):
        assert_lowering_matches(_model(), backend="numpy_wrong", registry=registry)


def test_the_cosine_bound_is_checked_on_its_own(registry):
    with pytest.raises(AssertionError, match="cosine similarity"):
        assert_lowering_matches(_model(), backend="numpy_wrong", registry=registry, rtol=10, atol=10, cosine=0.999999)


def test_the_reference_is_onnxruntime_for_a_standard_op(registry):
    model = single_op_model("Relu", inputs={"X": (3, 4)})
    inputs = random_inputs(model, seed=2)
    outputs, name = reference_outputs(model, inputs, registry=registry)
    assert name == "onnxruntime"
    np.testing.assert_allclose(outputs["Y"], np.maximum(inputs["X"], 0))


def test_random_inputs_follow_the_seed():
    model = _model()
    assert np.array_equal(random_inputs(model, seed=4)["X"], random_inputs(model, seed=4)["X"])
    assert not np.array_equal(random_inputs(model, seed=4)["X"], random_inputs(model, seed=5)["X"])


def test_an_op_without_reference_fails_as_a_build_would():
    registry = build_registry({"swish": SwishPlugin(with_reference=False)})
    with pytest.raises(BuildError, match=r"mydomain::Swish2, which onnxruntime cannot run"):
        assert_lowering_matches(_model(), backend="numpy_right", registry=registry)


def test_a_backend_without_a_runner_or_not_installed_is_a_usage_error(registry):
    with pytest.raises(UsageError, match="conformance_runner"):
        assert_lowering_matches(_model(), backend="no_runner", registry=registry)
    with pytest.raises(UsageError, match="no backend 'nowhere' is installed"):
        assert_lowering_matches(_model(), backend="nowhere", registry=registry)
