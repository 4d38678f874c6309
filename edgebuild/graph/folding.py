"""onnxscript's constant folding and clean-up, as much of it as an ``optimize.level`` asks for.

- O2 and O3 run ``onnxscript.optimizer.optimize_ir`` as it is: folding, its default rewrite rules
  (simplifications and two fusions, a Pad or a BatchNormalization merged into the Conv or Gemm
  before it), dead code, common subexpressions, duplicate initializers.
- O1 runs the same loop with the default rules less those fusions.
- O0 runs no rewrite rule: functions inlined, constants folded (the lowering needs static shapes:
  ``Shape -> Gather -> Concat -> Reshape`` chains become constant shapes), dead code removed,
  constants lifted to initializers, names and outputs fixed as the lowering expects them.

O0 and O1 build the loop from onnxscript's public pieces (``fold_constants``, ``RewritePass``) and
onnx_ir's passes, in ``optimize_ir``'s order, so a rule set can be chosen per build without
touching onnxscript's module-level rules, which every thread of the process shares.
"""

from __future__ import annotations

from typing import Callable, Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer
import onnxscript.rewriter

from edgebuild.graph.rule_matching import tried_at_their_first_op

ROUNDS = 2  # optimize_ir's num_iterations: fold, rewrite, clean, twice unless nothing changed
# onnxscript's default rules that merge one operator into another (the rest simplify in place)
FUSION_RULE_PREFIXES = ("FuseConvPad", "FuseConvIntegerPad", "FuseBatchNormInto")


def default_rules() -> tuple:
    return tuple(getattr(onnxscript.rewriter, "_DEFAULT_REWRITE_RULES", ()))


def is_fusion_rule(rule) -> bool:
    return str(getattr(rule, "name", None) or "").startswith(FUSION_RULE_PREFIXES)


def simplification_rules() -> tuple:
    """onnxscript's default rules without its fusions: no-ops, cast and reshape chains, slices,
    min/max/relu/clip chains, and the like."""
    return tuple(rule for rule in default_rules() if not is_fusion_rule(rule))


def rules_at(level: str) -> tuple:
    """The onnxscript rewrite rules that run at ``level``."""
    if level in ("O2", "O3"):
        return default_rules()
    return simplification_rules() if level == "O1" else ()


def fold_and_clean(model: ir.Model, level: str, should_fold: Callable[[ir.Node], bool | None]) -> None:
    """Fold constants and clean ``model`` up in place, as ``level`` allows."""
    if level in ("O2", "O3"):
        with tried_at_their_first_op(default_rules()):
            onnxscript.optimizer.optimize_ir(model, should_fold=should_fold)
        return
    rules = rules_at(level)
    with tried_at_their_first_op(rules):
        _fold_loop(model, rules, should_fold)
    finishing = [
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
    ]
    if rules:  # O1: what the same values computed twice or stored twice cost is simplification too
        finishing += [common_passes.DeduplicateInitializersPass(), common_passes.CommonSubexpressionEliminationPass()]
    finishing += [common_passes.OutputFixPass(), common_passes.NameFixPass()]
    for graph_pass in finishing:
        graph_pass(model)


def _fold_loop(model: ir.Model, rules: Sequence, should_fold) -> None:
    common_passes.InlinePass()(model)
    rewrite = onnxscript.rewriter.RewritePass(list(rules)) if rules else None
    for _ in range(ROUNDS):
        modified = onnxscript.optimizer.fold_constants(model, onnx_shape_inference=True,
                                                       should_fold=should_fold).modified
        if rewrite is not None:
            modified |= rewrite(model).modified
        for clean in (common_passes.RemoveUnusedNodesPass(), common_passes.RemoveUnusedFunctionsPass(),
                      common_passes.RemoveUnusedOpsetsPass()):
            modified |= clean(model).modified
        if not modified:
            break
