"""Rewrite rules are tried only at nodes of their first output's op, and match as before."""

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


class _ReluOfRelu(RewriteRuleClassBase):
    """Relu(Relu(x)) -> Relu(x): a one-output pattern."""

    def pattern(self, op, x):
        return op.Relu(op.Relu(x))

    def rewrite(self, op, x):
        return op.Relu(x)


def _relu_chain(tanh: int) -> ir.Model:
    """``tanh`` Tanh nodes, then Relu(Relu(.)), and its sum with the input."""
    x = ir.Value(name="x", shape=ir.Shape([2, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    nodes, value = [], x
    for op_type in ["Tanh"] * tanh + ["Relu", "Relu"]:
        nodes.append(ir.Node("", op_type, [value], name=f"n{len(nodes)}"))
        value = nodes[-1].outputs[0]
    nodes.append(ir.Node("", "Add", [value, x], name="add"))
    nodes[-1].outputs[0].name = "y"
    return ir.Model(ir.Graph([x], [nodes[-1].outputs[0]], nodes=nodes, opset_imports={"": 18}), ir_version=10)


def test_a_one_output_rule_is_tried_only_at_its_op_and_fires_as_it_did():
    rule = _ReluOfRelu.rule()
    tried: list[str] = []
    real = rule.try_rewrite

    def counting(model, graph, node, *args, **kwargs):
        tried.append(node.op_type)
        return real(model, graph, node, *args, **kwargs)

    plain, guarded = _relu_chain(tanh=10), _relu_chain(tanh=10)
    assert pattern.RewriteRuleSet([rule]).apply_to_model(plain) == 1
    rule.try_rewrite = counting
    with tried_at_their_first_op([rule]):
        assert pattern.RewriteRuleSet([rule]).apply_to_model(guarded) == 1
    assert set(tried) == {"Relu"}  # not the Tanh nodes, not the Add
    assert [n.op_type for n in guarded.graph] == [n.op_type for n in plain.graph]


def test_commuted_copies_are_guarded_at_their_op():
    """``commute()`` copies a pattern with its op as a constant pattern (no op identifier): the
    copies of a rule rooted at Add are still tried at Add nodes only."""

    class _AddOfRelu(RewriteRuleClassBase):
        def pattern(self, op, x, y):
            return op.Add(op.Relu(x), y)

        def rewrite(self, op, x, y):
            return op.Sub(x, y)

    copies = pattern.RewriteRuleSet([_AddOfRelu.rule()], commute=True).rules
    assert len(copies) == 2
    model = _relu_chain(tanh=5)
    with tried_at_their_first_op(copies):
        tried = [rule for rule in copies if "try_rewrite" in vars(rule)]
        assert tried == copies
        assert all(rule.try_rewrite(model, model.graph, node) is None
                   for rule in copies for node in model.graph if node.op_type != "Add")
        assert pattern.RewriteRuleSet(copies).apply_to_model(model) == 1
    assert "Sub" in {n.op_type for n in model.graph}


def test_every_default_rule_rooted_at_one_op_is_guarded():
    rules = list(rewriter._DEFAULT_REWRITE_RULES)
    with tried_at_their_first_op(rules):
        unguarded = [rule for rule in rules if "try_rewrite" not in vars(rule)]
    # only rules whose root op is itself a pattern (an op alternative) stay tried everywhere
    assert all(rule._target_pattern.output_nodes[0].op_identifier() is None for rule in unguarded)
    assert len(unguarded) < len(rules) // 4


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
