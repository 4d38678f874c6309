"""A function's plan is its own while its ops are the same in the same order, however it is told
(the ops' index in coremltools' linked list, read at C speed): any edit a pass makes (an op added,
removed, moved, replaced) gets a new plan, and the inputs' declared types read once per plan are
read again when an input is retyped."""

from __future__ import annotations

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from interpreter_programs import spec  # noqa: E402

from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_coreml.interpreter import run_program  # noqa: E402
from edgebuild_coreml.interpreter.executor import run_program_samples  # noqa: E402
from edgebuild_coreml.interpreter.plan import operations_of, plan_for  # noqa: E402

X = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4


def _chain():
    @mb.program(input_specs=[spec((3, 4))], opset_version=ct.target.iOS17)
    def prog(x):
        a = mb.relu(x=x, name="a")
        b = mb.mul(x=a, y=np.float32(2), name="b")
        return mb.add(x=b, y=np.float32(1), name="out")

    return prog


def _op(func, name):
    return next(op for op in func.operations if op.name == name)


def _edit_add(func):
    """An op added before the output's: ``out = (b * 3) + 1``."""
    out_op = _op(func, "out")
    with func:
        tripled = mb.mul(x=out_op.x, y=np.float32(3), before_op=out_op, name="tripled")
    out_op.enclosing_block.replace_uses_of_var_after_op(anchor_op=tripled.op, old_var=out_op.x, new_var=tripled,
                                                        end_op=out_op)
    return lambda x: (np.maximum(x, 0) * 2 * 3) + 1


def _edit_remove(func):
    """The ``mul`` taken out: ``out = relu(x) + 1``."""
    mul_op = _op(func, "b")
    func.replace_uses_of_var_after_op(anchor_op=mul_op, old_var=mul_op.outputs[0], new_var=mul_op.x)
    func.remove_ops([mul_op])
    return lambda x: np.maximum(x, 0) + 1


def _edit_replace(func):
    """The ``relu`` replaced by a ``sigmoid`` of the same input, in its place."""
    relu_op = _op(func, "a")
    with func:
        sig = mb.sigmoid(x=relu_op.x, before_op=relu_op, name="a_sigmoid")
    func.replace_uses_of_var_after_op(anchor_op=relu_op, old_var=relu_op.outputs[0], new_var=sig)
    func.remove_ops([relu_op])
    return lambda x: 1 / (1 + np.exp(-x)) * 2 + 1


@pytest.mark.parametrize("edit", [_edit_add, _edit_remove, _edit_replace])
@pytest.mark.parametrize("fp16", [False, True])
def test_every_edit_gets_a_new_plan_and_its_values(edit, fp16):
    prog = _chain()
    func = prog.functions["main"]
    np.testing.assert_allclose(run_program(prog, {"x": X}, fp16=fp16)["out"], np.maximum(X, 0) * 2 + 1, rtol=1e-3)
    before = plan_for(func, fp16=fp16)
    expected = edit(func)
    assert not before.matches(func)
    assert plan_for(func, fp16=fp16) is not before
    for run in (lambda: run_program(prog, {"x": X}, fp16=fp16)["out"],
                lambda: run_program_samples(prog, [{"x": X}], fp16=fp16)[0]["out"]):
        np.testing.assert_allclose(run(), expected(X), rtol=1e-3, atol=1e-3)


def test_the_same_ops_keep_their_plan():
    prog = _chain()
    func = prog.functions["main"]
    run_program(prog, {"x": X})
    plan = plan_for(func, fp16=False)
    assert plan.matches(func) and plan_for(func, fp16=False) is plan
    assert len(operations_of(func)) == len(list(func.operations))


def test_an_op_taken_out_and_put_back_elsewhere_is_another_program():
    """The op added last, removed and inserted again earlier: the index holds the same ops in
    the same order, the list another order; its new node tells them apart."""
    prog = _chain()
    func = prog.functions["main"]
    before = operations_of(func)
    last = list(func.operations)[-1]
    operations = func.operations
    operations.remove(last)
    operations.insert_op_before(last, before_op=list(func.operations)[0])
    assert operations_of(func) != before
    operations.remove(last)
    operations.insert_op_before(last)  # back where it was, by a new node still
    assert operations_of(func) != before


def test_a_plain_list_of_ops_is_compared_op_by_op():
    class Stand:
        def __init__(self, ops):
            self.operations = list(ops)

    a, b = object(), object()
    assert operations_of(Stand([a, b])) == operations_of(Stand([a, b]))
    assert operations_of(Stand([a, b])) != operations_of(Stand([b, a]))


@pytest.mark.parametrize("dtype, np_dtype", [(types.fp32, np.float32), (types.fp16, np.float16),
                                             (types.int32, np.int32)])
def test_inputs_are_cast_to_their_declared_type_call_after_call(dtype, np_dtype):
    @mb.program(input_specs=[spec((3, 4), dtype)], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.identity(x=x, name="out")

    given = (X * 4).astype(np.float64)
    for _ in range(3):  # the first call reads the declarations, the next ones reuse them
        got = run_program(prog, {"x": given})["out"]
        assert got.dtype == np_dtype
        np.testing.assert_allclose(got.astype(np.float64), given.astype(np_dtype).astype(np.float64))


def test_an_input_retyped_in_place_is_read_again():
    prog = _chain()
    func = prog.functions["main"]
    run_program(prog, {"x": X})
    var = func.inputs["x"]
    var._sym_type = types.tensor(types.fp32, (2, 4))  # a pass retyping the input, no op changed
    with pytest.raises(BuildError, match="input 'x' has shape"):
        run_program(prog, {"x": X})


def test_a_missing_input_is_named_every_call():
    prog = _chain()
    for _ in range(2):
        with pytest.raises(BuildError, match="'x' not given"):
            run_program(prog, {"y": X})
