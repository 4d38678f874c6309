"""The Core ML lowering of com.example::RMSNorm against the op's reference: three lines with
edgebuild.plugin.testing, and the fp16 path through the converter itself."""

from __future__ import annotations

import numpy as np
import pytest

from edgebuild.plugin import BuildError, get_registry
from edgebuild.plugin.testing import assert_lowering_matches, single_op_model

from edgebuild_example_ops import DOMAIN, OP_TYPE
from edgebuild_example_ops.reference import rms_norm

pytest.importorskip("edgebuild_coreml")

SCALE = np.random.default_rng(3).standard_normal(48).astype(np.float32)


@pytest.mark.parametrize("shape", [(2, 48), (2, 5, 48)])
def test_lowering_matches_the_reference(shape):
    model = single_op_model(OP_TYPE, domain=DOMAIN, inputs={"X": shape, "scale": SCALE}, attributes={"epsilon": 1e-5})
    assert_lowering_matches(model, backend="coreml", rtol=1e-5, atol=1e-5, cosine=0.99999)


def test_a_wrong_lowering_fails_the_helper(monkeypatch):
    """The helper can fail: the reference with another epsilon is not what the lowering computes."""
    model = single_op_model(OP_TYPE, domain=DOMAIN, inputs={"X": (2, 48), "scale": SCALE}, attributes={"epsilon": 1e-5})
    spec = get_registry().get("custom_ops", (DOMAIN, OP_TYPE))
    monkeypatch.setattr(type(spec), "run_reference",
                        lambda self, inputs, attrs=None: {"Y": rms_norm(inputs["X"], inputs["scale"], epsilon=10.0)})
    with pytest.raises(AssertionError, match=r"com.example::RMSNorm lowered by 'coreml', output 'Y'.*max \|difference\|"):
        assert_lowering_matches(model, backend="coreml", inputs={"X": np.full((2, 48), 0.1, np.float32)})


def test_a_failing_lowering_names_this_plugin():
    model = single_op_model(OP_TYPE, domain=DOMAIN, inputs={"X": (2, 48), "scale": SCALE},
                            attributes={"epsilon": "not a number"})
    with pytest.raises(BuildError, match=r"node 'RMSNorm' \(com.example::RMSNorm\): the lowering from plugin "
                                         r"'example_ops' \(edgebuild-example-ops [^)]+\) failed: ValueError"):
        assert_lowering_matches(model, backend="coreml")


def test_fp16_lowering_is_a_decomposition_close_to_the_reference():
    import onnx_ir as ir
    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.lowering.converter import convert

    x = np.random.default_rng(4).standard_normal((2, 5, 48)).astype(np.float32)
    model = single_op_model(OP_TYPE, domain=DOMAIN, inputs={"X": x.shape, "scale": SCALE}, attributes={"epsilon": 1e-5})
    result = convert(ir.serde.deserialize_model(model), target="iOS17", precision="float16", registry=get_registry())
    assert result.op_counts.get("reduce_mean") == 1 and result.op_counts.get("rsqrt") == 1
    feed_dtype = np.float16 if result.input_dtypes[result.input_names["X"]] == "fp16" else np.float32
    produced = run_program(result.program, {result.input_names["X"]: x.astype(feed_dtype)}, fp16=True)
    got = np.asarray(produced[result.output_names["Y"]], dtype=np.float32)
    np.testing.assert_allclose(got, rms_norm(x, SCALE, epsilon=1e-5), rtol=3e-2, atol=3e-2)
