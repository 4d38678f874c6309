"""If, lowered through the converter's ``lower_subgraph`` into MIL ``cond`` blocks (Loop: ``loop.py``)."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.registry import lowers


def _single_element_ranks(then_graph, else_graph) -> dict[int, int]:
    """{output index: rank} where one branch yields a scalar and the other a [1, ...] tensor.

    ONNX lets branches differ in shape (its own function bodies mix a scalar constant with a
    piece of a split shape); MIL ``cond`` needs one type, so such outputs take the higher rank.
    """
    ranks = {}
    for i, (a, b) in enumerate(zip(then_graph.outputs, else_graph.outputs)):
        if a.shape is None or b.shape is None or a.shape.rank() == b.shape.rank():
            continue
        if all(d == 1 for d in (*a.shape, *b.shape)):
            ranks[i] = max(a.shape.rank(), b.shape.rank())
    return ranks


def _lower_branch(ctx, graph, ranks: dict[int, int]):
    outputs = ctx.lower_subgraph(graph, [])
    outputs = [mb.reshape(x=v, shape=np.ones(ranks[i], np.int32)) if i in ranks and v.rank != ranks[i] else v
               for i, v in enumerate(outputs)]
    return tuple(outputs) if len(outputs) != 1 else outputs[0]


@lowers("If")
def if_(ctx, node):
    """A constant condition picks its branch at build time; otherwise MIL ``cond``."""
    then_graph, else_graph = ctx.attr(node, "then_branch"), ctx.attr(node, "else_branch")
    condition = ctx.input(node, 0)
    if isinstance(condition, np.ndarray) or getattr(condition, "val", None) is not None:
        chosen = then_graph if bool(np.asarray(getattr(condition, "val", condition)).reshape(())) else else_graph
        outputs = ctx.lower_subgraph(chosen, [])
        return tuple(outputs) if len(outputs) != 1 else outputs[0]
    if len(then_graph.outputs) != len(else_graph.outputs):
        ctx.fail(node, "the branches produce different numbers of outputs")
    # an empty shape list would be typed float; MIL wants an int32 shape
    pred = mb.reshape(x=condition, shape=np.zeros(0, np.int32), name=ctx.name(node, "pred")) if condition.rank else condition
    ranks = _single_element_ranks(then_graph, else_graph)
    if _else_is_more_general(then_graph, else_graph):
        # MIL's cond takes its output types from the true branch: a run-time dim must come first
        # (torchvision's batched_nms returns an empty [0] in one branch, [N] in the other)
        pred = mb.logical_not(x=pred, name=ctx.name(node, "pred_not"))
        then_graph, else_graph = else_graph, then_graph
    try:
        result = mb.cond(pred=pred, _true_fn=lambda: _lower_branch(ctx, then_graph, ranks),
                         _false_fn=lambda: _lower_branch(ctx, else_graph, ranks), name=ctx.name(node))
    except ValueError as exc:
        if "mismatch" not in str(exc):
            raise
        # the unify_if_branches pass makes one shape of what ONNX semantics allow; this is the rest
        ctx.decline(node, f"its branches give an output in two shapes MIL's cond cannot join: "
                    f"{_shape_mismatches(then_graph, else_graph) or exc}",
                    hint="make both branches return the output in one shape (a Reshape at the end of one), "
                         "or route the If to another backend")
    return tuple(result) if isinstance(result, (list, tuple)) else result


def _else_is_more_general(then_graph, else_graph) -> bool:
    """Some output has a static dim in then_branch where else_branch's is known only at run time, and none
    the other way round."""
    def static_against_runtime(a, b):
        return sum(1 for x, y in zip(a.shape, b.shape) if isinstance(x, int) and not isinstance(y, int))

    pairs = [(a, b) for a, b in zip(then_graph.outputs, else_graph.outputs)
             if a.shape is not None and b.shape is not None and len(a.shape) == len(b.shape)]
    return any(static_against_runtime(a, b) for a, b in pairs) and not any(static_against_runtime(b, a) for a, b in pairs)


def _shape_mismatches(then_graph, else_graph) -> str:
    """Each output whose branches differ in shape, in words (unknown shapes are skipped)."""
    def dims(shape):
        return [d if isinstance(d, int) else (d.value or "?") for d in shape]

    return "; ".join(
        f"output {i} is {dims(a.shape)} in then_branch and {dims(b.shape)} in else_branch"
        for i, (a, b) in enumerate(zip(then_graph.outputs, else_graph.outputs))
        if a.shape is not None and b.shape is not None and dims(a.shape) != dims(b.shape))
