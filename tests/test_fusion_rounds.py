"""Which rules a fusion round tries: those whose ops the graph has (or the pass can add).

The byte-for-byte check (the six dev recipes optimise to the same model.onnx with and without
the filter) is too slow for the default run; these check the reading of the rules' patterns
and that a chain of rewrites within one pass (MatMul -> Linear, then its bias) still completes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter import pattern

from edgebuild.graph.fusion import PASSES, may_match, op_identifiers, required_ops


@pytest.mark.parametrize("name", sorted(PASSES))
def test_every_rule_and_its_commuted_variants_name_their_ops(name):
    graph_pass = PASSES[name]
    rules = list(graph_pass.rules())
    expanded = pattern.RewriteRuleSet(rules, commute=graph_pass.commute).rules
    for rule in expanded:
        assert required_ops(rule), f"{name}: {rule.name} names no op"
    # a commuted variant needs the ops of its rule, no more and no fewer
    by_name: dict[str, set] = {}
    for rule in rules:
        by_name.setdefault(rule.name, set()).add(frozenset(required_ops(rule)))
    for rule in expanded:
        assert frozenset(required_ops(rule)) in by_name[rule.name]


def test_alternatives_are_not_required():
    # layer norm's variance squares with Pow or Mul (an OrValue): neither is required
    rule = next(r for r in PASSES["fuse_layer_norm"].rules() if ("", "ReduceMean") in required_ops(r))
    assert ("", "Pow") not in required_ops(rule)
    assert may_match(rule, {("", op) for op in ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div")})
    assert not may_match(rule, {("", op) for op in ("Sub", "Mul", "Add", "Sqrt", "Div")})


def _matmul_add_model() -> ir.Model:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ir.serde.deserialize_model(model)


def test_a_rule_needing_what_the_pass_creates_fires_in_the_same_pass():
    model = _matmul_add_model()
    assert PASSES["fuse_bias"].apply(model) >= 1
    assert op_identifiers(model) == {("edgebuild", "Linear")}
    [node] = list(model.graph)
    assert len(node.inputs) == 3  # the Add folded into the Linear's bias


def test_a_pass_with_nothing_to_match_changes_nothing():
    model = _matmul_add_model()
    before = ir.serde.serialize_model(model).SerializeToString()
    assert PASSES["fuse_attention"].apply(model) == 0
    assert ir.serde.serialize_model(model).SerializeToString() == before
