"""Rules with several output nodes are tried only at nodes of their first output's op, and match
as before."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import rewriter
from onnxscript.rewriter import pattern
from onnxscript.rewriter._rewrite_rule import RewriteRuleClassBase

from edgebuild.graph.rule_matching import tried_at_their_first_op


class _ReluAndSigmoidOfOneValue(RewriteRuleClassBase):
    """Relu(x), Sigmoid(x) -> Abs(x), Neg(x): a two-output pattern (what it computes is beside the point)."""

    def pattern(self, op, x):
        return op.Relu(x), op.Sigmoid(x)

    def rewrite(self, op, x):
        return op.Abs(x), op.Neg(x)


def _model(chain: int = 0) -> ir.Model:
    """``chain`` Tanh nodes, then Relu and Sigmoid of the last value, both graph outputs."""
    x = ir.Value(name="x", shape=ir.Shape([2, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes, value = [], x
    for i in range(chain):
        nodes.append(ir.Node("", "Tanh", [value], name=f"tanh{i}"))
        value = nodes[-1].outputs[0]
    nodes += [ir.Node("", "Relu", [value], name="relu"), ir.Node("", "Sigmoid", [value], name="sigmoid")]
    outputs = [nodes[-2].outputs[0], nodes[-1].outputs[0]]
    for output, name in zip(outputs, ("r", "s")):
        output.name = name
    return ir.Model(ir.Graph([x], outputs, nodes=nodes, opset_imports={"": 18}), ir_version=10)


def test_a_two_output_rule_fires_as_it_did():
    rule = _ReluAndSigmoidOfOneValue.rule()
    plain, guarded = _model(chain=3), _model(chain=3)
    assert pattern.RewriteRuleSet([rule]).apply_to_model(plain) == 1
    with tried_at_their_first_op([rule]):
        assert pattern.RewriteRuleSet([rule]).apply_to_model(guarded) == 1
    assert [n.op_type for n in guarded.graph] == [n.op_type for n in plain.graph]
    assert {"Abs", "Neg"} <= {n.op_type for n in guarded.graph}


def test_nodes_of_other_ops_are_not_tried_and_the_rule_is_restored():
    rule = _ReluAndSigmoidOfOneValue.rule()
    tried: list[str] = []
    real = rule.try_rewrite

    def counting(model, graph, node, *args, **kwargs):
        tried.append(node.op_type)
        return real(model, graph, node, *args, **kwargs)

    rule.try_rewrite = counting
    with tried_at_their_first_op([rule]):
        pattern.RewriteRuleSet([rule]).apply_to_model(_model(chain=20))
    assert tried == ["Relu"]  # not the 20 Tanh nodes, not the Sigmoid
    assert rule.try_rewrite is counting  # what the instance held before, back
    del rule.try_rewrite
    with tried_at_their_first_op([rule]):
        pass
    assert "try_rewrite" not in vars(rule)


def test_single_output_rules_are_left_alone():
    single = [rule for rule in rewriter._DEFAULT_REWRITE_RULES
              if len(getattr(rule, "_target_pattern").output_nodes) == 1]
    assert single
    with tried_at_their_first_op(single):
        assert not any("try_rewrite" in vars(rule) for rule in single)


def test_overlapping_scopes_leave_the_rule_as_it_was():
    """Two builds optimising side by side: the guard stays while either runs, and goes with the last."""
    rule = _ReluAndSigmoidOfOneValue.rule()
    first, second = tried_at_their_first_op([rule]), tried_at_their_first_op([rule])
    first.__enter__()
    guarded = rule.try_rewrite
    second.__enter__()
    assert rule.try_rewrite is guarded  # not a guard around the guard
    first.__exit__(None, None, None)
    assert rule.try_rewrite is guarded  # the second build still has it
    second.__exit__(None, None, None)
    assert "try_rewrite" not in vars(rule)
