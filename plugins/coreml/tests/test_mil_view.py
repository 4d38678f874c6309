"""The plan's cached type answers equal coremltools' own, for every kind of var."""

from __future__ import annotations

import numpy as np
from coremltools import target
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from edgebuild_coreml.ane import mil_view


def _program():
    query = get_new_symbol()

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, query), dtype=types.int32),
                             mb.StateTensorSpec(shape=(1, 4, 8, 2), dtype=types.fp16)],
                opset_version=target.iOS18)
    def prog(ids, cache):
        whole = mb.read_state(input=cache)
        length = mb.slice_by_index(x=mb.shape(x=ids), begin=[1], end=[2])  # int32 [1]
        scalar = mb.squeeze(x=length)  # int32 scalar
        rows = mb.cast(x=mb.fill(shape=mb.concat(values=[np.array([1], np.int32), length], axis=0), value=1.0),
                       dtype="fp16")
        flags = mb.greater(x=rows, y=np.float16(0.5))  # bool
        mb.coreml_update_state(state=cache, value=whole)
        return mb.add(x=mb.cast(x=flags, dtype="fp32"), y=mb.cast(x=scalar, dtype="fp32"))

    return prog


def test_cached_answers_equal_coremltools_for_every_var():
    function = mil_view.main_function(_program())
    variables = list(function.inputs.values()) + [var for op in function.operations for var in op.outputs]
    kinds = set()
    for var in variables:
        sym = var.sym_type
        kinds.add("state" if types.is_state(sym) else "tensor" if types.is_tensor(sym) else "scalar")
        assert mil_view.dtype_name(var) == types.builtin_to_string(var.dtype), var.name
        assert mil_view.shape_of(var) == (tuple(var.shape) if types.is_tensor(sym) else ()), var.name
        assert mil_view.is_tensor_like(var) == (types.is_tensor(sym) or (types.is_scalar(sym) and not types.is_str(sym)))
        # asked twice, from the cache: the same
        assert mil_view.dtype_name(var) == types.builtin_to_string(var.dtype)
    assert kinds == {"state", "tensor", "scalar"}
    assert any(is_symbolic(d) for var in variables for d in mil_view.shape_of(var))
    assert {mil_view.dtype_name(v) for v in variables} >= {"int32", "fp16", "fp32", "bool"}
