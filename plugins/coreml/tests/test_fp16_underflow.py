"""The fp16 pass's underflow check does what coremltools' own does, element for element."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from coremltools.converters.mil.mil.passes.defs.quantization import add_fp16_cast

from edgebuild_coreml.lowering.passes import UNDERFLOW_CHECK_MAX_ELEMENTS, underflow_flushed


class _Var:
    """What the check reads of a pymil Var: ``val``, stored in ``_sym_val.val``."""

    def __init__(self, val):
        self._sym_val = SimpleNamespace(val=val)

    @property
    def val(self):
        return self._sym_val.val


def _coremltools_result(original):
    cast = _Var(original.astype(np.float16) if isinstance(original, np.ndarray) else np.float16(original))
    add_fp16_cast()._check_underflow_to_zero(cast, _Var(original))
    return cast.val


def _cases():
    rng = np.random.default_rng(0)
    tiny = np.array([1e-9, -1e-9, 3e-8, -7e-8, 0.0, -0.0, 1e-45, np.nan, np.inf, -np.inf, 1.0], np.float32)
    yield "mixed", tiny
    yield "no-underflow", rng.standard_normal(50).astype(np.float32)
    yield "2d", rng.choice(tiny, size=(6, 7)).astype(np.float32)
    yield "scalar-underflowing", np.float32(1e-10)
    yield "scalar-negative", np.float32(-2e-9)
    yield "scalar-zero", np.float32(0.0)


@pytest.mark.parametrize("name,original", list(_cases()), ids=[c[0] for c in _cases()])
def test_flushing_equals_coremltools(name, original):
    expected = _coremltools_result(original)
    cast = original.astype(np.float16) if isinstance(original, np.ndarray) else np.float16(original)
    flushed = underflow_flushed(original, cast)
    got = cast if flushed is None else flushed
    assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == np.float16
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(expected).view(np.uint16))
    assert (flushed is not None) == bool(np.any(np.asarray(got).view(np.uint16) != np.asarray(cast).view(np.uint16)))


def test_large_constants_are_not_checked_and_not_copied():
    original = np.full(UNDERFLOW_CHECK_MAX_ELEMENTS, 1e-9, np.float32)
    assert underflow_flushed(original, original.astype(np.float16)) is None
