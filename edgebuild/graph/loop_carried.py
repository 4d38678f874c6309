"""Loop-carried values whose declared shape holds for the first iteration only.

An exporter may declare a Loop body's carried input with the shape of its initial value. For an
accumulator that starts empty and grows by a row per iteration (torchvision's ONNX mask pasting:
``res = cat(res, mask[None])`` from ``zeros(0, H, W)``) that is ``[0, H, W]``, true once. The
folder trusts declared shapes and drops a Concat input it believes empty, so the loop would give
back the last row alone. Before folding, each carried input keeps a dim only where the body's
output for it declares the same dim; where the output's dim differs or is unknown the dim becomes
unknown, since the body may change it. A body output with no declared shape says nothing either
way: the input keeps its dims, less any of size 0 (an empty start is an accumulator's).
"""

from __future__ import annotations

import onnx_ir as ir

from edgebuild.graph.external_data import iter_graphs

CARRIED_START = 2  # body inputs: iteration number, condition, then the carried values


def forget_varying_carried_dims(model: ir.Model) -> int:
    """Relax the declared dims of every Loop's carried body inputs (nested loops too); returns how many changed."""
    changed = 0
    for graph in iter_graphs(model.graph):
        for node in graph:
            if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and "body" in node.attributes:
                changed += _relax_body(node.attributes["body"].as_graph())
    return changed


def _relax_body(body: ir.Graph) -> int:
    changed = 0
    carried = body.inputs[CARRIED_START:]
    outputs = body.outputs[1:1 + len(carried)]  # after the condition; scan outputs follow
    for value, out in zip(carried, outputs):
        relaxed = relaxed_shape(value.shape, out.shape)
        if relaxed is not None:
            value.shape = relaxed
            changed += 1
    return changed


def relaxed_shape(declared: ir.Shape | None, produced: ir.Shape | None) -> ir.Shape | None:
    """The carried input's shape with the dims the body may change made unknown; None when unchanged."""
    if declared is None:
        return None
    dims = list(declared.dims)
    if produced is None:
        kept = [None if _static(d) and int(d) == 0 else d for d in dims]
    elif len(produced.dims) == len(dims):
        kept = [d if _same(d, p) or _unknown(d) else None for d, p in zip(dims, produced.dims)]
    else:
        return None  # a rank change: the lowering refuses it with its own message
    if all(k is d for k, d in zip(kept, dims)):
        return None
    return ir.Shape(kept)


def _static(dim) -> bool:
    return isinstance(dim, int)


def _unknown(dim) -> bool:
    return not _static(dim) and dim.value is None


def _same(a, b) -> bool:
    """Two dims known to be equal: the same size, or the same named dim."""
    if _static(a) or _static(b):
        return _static(a) and _static(b) and int(a) == int(b)
    return a is not None and b is not None and a.value is not None and a.value == b.value
