"""Reshape output shapes by division (``lowering.reshape_shapes``) equal coremltools' solver's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sympy
from coremltools.converters.mil.mil import get_new_symbol
from coremltools.converters.mil.mil.ops.defs.iOS15.tensor_transformation import reshape
from edgebuild.graph.optimize import optimize
from edgebuild.graph.weight_files import load_stage_model
from edgebuild_coreml.ane.per_shape import specialise
from edgebuild_coreml.lowering.converter import convert
from edgebuild_coreml.lowering.reshape_shapes import direct_shape, solving_reshapes_directly

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "testplugin"))
from edgebuild_testplugin import llm_families  # noqa: E402


def _solved(in_shape, target) -> list:
    """coremltools' own answer, on a stand-in op (the method reads only ``x.shape``, ``shape.sym_val``)."""
    class Var:
        def __init__(self, shape=None, sym_val=None):
            self.shape, self.sym_val = shape, sym_val

    class Op:
        x, shape = Var(shape=tuple(in_shape)), Var(sym_val=list(target))

    return reshape._infer_shape_dynamic(Op())


def _symbols(dims) -> set:
    return set().union(*(sympy.sympify(d).free_symbols for d in dims))


def _same(a, b, named: set) -> bool:
    """Equal shapes; two fresh symbols (named by neither the input nor the target) count as equal."""
    def fresh(d):
        return isinstance(d, sympy.Symbol) and d not in named

    return len(a) == len(b) and all(
        (fresh(x) and fresh(y)) or sympy.expand(sympy.sympify(x) - sympy.sympify(y)) == 0 for x, y in zip(a, b))


def test_direct_answers_equal_the_solver_and_hard_cases_are_left_to_it():
    q, p = get_new_symbol(), get_new_symbol()
    answered = [
        ((1, q, 2048), [1, q, 32, 64]),  # heads split: volumes equal as they stand
        ((1, q, 2048), [1, q, -1, 64]),  # the -1 an integer
        ((1, 32, q, 64), [1, -1, 2048]),  # the -1 a multiple of the symbol
        ((1, 4, p, q, 64), [1, 4, -1, 64]),  # a product of symbols
        ((q, 2048), [-1]),
        ((1, q, 2048), [1, -1, 3]),  # a fractional coefficient, as the solver leaves it
        ((1, q, 2048), [1, p, -1, 64]),  # a size the input does not name: the -1 stays a symbol
        ((1, 1, 64), [1, p, -1, 16]),
    ]
    for in_shape, target in answered:
        direct = direct_shape(in_shape, target)
        assert direct is not None, (in_shape, target)
        assert _same(direct, _solved(in_shape, target), _symbols([*in_shape, *target])), (in_shape, target, direct)
    fresh = get_new_symbol()  # a run-time size the input does not know
    left = [((1, q, 2048), [1, fresh, 2048]),  # the solver takes fresh = q
            ((1, q, 2048), [1, 2 * fresh, -1]),
            ((1, q, 100), [1, -1, -1])]
    for in_shape, target in left:
        assert direct_shape(in_shape, target) is None, (in_shape, target)


def test_a_decoder_lowers_and_specialises_to_the_same_shapes(tmp_path, monkeypatch):
    """Every reshape type inference while a real decoder is lowered and fixed to each query
    length: the direct answer, where given, equals the solver's; most are given."""
    optimize(llm_families.onnx_decoder("llama"), tmp_path / "optimized")
    seen = {"direct": 0, "solver": 0}
    solve = reshape._infer_shape_dynamic

    def checked(op):
        solved = solve(op)
        direct = direct_shape(op.x.shape, op.shape.sym_val)
        if direct is None:
            seen["solver"] += 1
        else:
            seen["direct"] += 1
            assert _same(direct, solved, _symbols([*op.x.shape, *op.shape.sym_val])), (op.name, direct, solved)
        return solved

    monkeypatch.setattr(reshape, "_infer_shape_dynamic", checked)
    generate = {"max_context": 64, "query_lengths": [1, 8], "logits": "all", "cache": "auto"}
    result = convert(load_stage_model(tmp_path / "optimized" / "model.onnx"), target="iOS18", generate=generate)
    for length in generate["query_lengths"]:
        specialise(result.program, {"input_ids": (1, length)})
    assert seen["direct"] >= 10 and seen["direct"] > 4 * seen["solver"], seen


def test_the_patch_is_undone():
    solve = reshape._infer_shape_dynamic
    with solving_reshapes_directly():
        assert reshape._infer_shape_dynamic is not solve
    assert reshape._infer_shape_dynamic is solve
    with pytest.raises(RuntimeError), solving_reshapes_directly():
        raise RuntimeError("a failed lowering")
    assert reshape._infer_shape_dynamic is solve
