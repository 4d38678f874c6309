"""Reduction evaluators of the MIL interpreter (reduce_*, reduce_argmax/argmin) against numpy.

Programs are built with coremltools' Builder, saved as .mlpackage, read back and interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from interpreter_programs import roundtrip, spec  # noqa: E402

RNG = np.random.default_rng(0)


X3 = RNG.uniform(0.2, 2.0, (2, 3, 4)).astype(np.float32)
REDUCE_REFERENCE = {
    "reduce_sum": lambda v, a, k: v.sum(axis=a, keepdims=k),
    "reduce_mean": lambda v, a, k: v.mean(axis=a, keepdims=k),
    "reduce_prod": lambda v, a, k: v.prod(axis=a, keepdims=k),
    "reduce_max": lambda v, a, k: v.max(axis=a, keepdims=k),
    "reduce_min": lambda v, a, k: v.min(axis=a, keepdims=k),
    "reduce_sum_square": lambda v, a, k: (v * v).sum(axis=a, keepdims=k),
    "reduce_l1_norm": lambda v, a, k: np.abs(v).sum(axis=a, keepdims=k),
    "reduce_l2_norm": lambda v, a, k: np.sqrt((v * v).sum(axis=a, keepdims=k)),
    "reduce_log_sum": lambda v, a, k: np.log(v.sum(axis=a, keepdims=k)),
    "reduce_log_sum_exp": lambda v, a, k: np.log(np.exp(v).sum(axis=a, keepdims=k)),
}


@pytest.fixture(scope="module")
def reduce_outputs(tmp_path_factory):
    @mb.program(input_specs=[spec((2, 3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        outs = []
        for name in REDUCE_REFERENCE:
            op = getattr(mb, name)
            outs.append(op(x=x, axes=[1], keep_dims=False, name=f"{name}_ax1"))
            outs.append(op(x=x, axes=[0, -1], keep_dims=True, name=f"{name}_keep"))
            outs.append(op(x=x, name=f"{name}_all"))
        outs.append(mb.reduce_argmax(x=x, axis=1, name="argmax"))
        outs.append(mb.reduce_argmin(x=x, axis=-1, keep_dims=True, name="argmin"))
        return tuple(outs)

    return roundtrip(prog, tmp_path_factory.mktemp("red"), {"x": X3})


@pytest.mark.parametrize("name", list(REDUCE_REFERENCE))
def test_reduction_matches_numpy(reduce_outputs, name):
    v = X3.astype(np.float64)
    ref = REDUCE_REFERENCE[name]
    np.testing.assert_allclose(reduce_outputs[f"{name}_ax1"], ref(v, 1, False), rtol=1e-5)
    np.testing.assert_allclose(reduce_outputs[f"{name}_keep"], ref(v, (0, 2), True), rtol=1e-5)
    np.testing.assert_allclose(reduce_outputs[f"{name}_all"], ref(v, None, False), rtol=1e-5)


def test_argmax_argmin(reduce_outputs):
    np.testing.assert_array_equal(reduce_outputs["argmax"], X3.argmax(axis=1))
    np.testing.assert_array_equal(reduce_outputs["argmin"], X3.argmin(axis=-1)[..., None])
    assert reduce_outputs["argmax"].dtype == np.int32
