"""Rules with several output nodes, tried only where their first output's op is.

onnxscript matches a pattern with several outputs (``SlicesSplit``: two Slices of one value) by
indexing every node of the graph by op and then trying the combinations, and does that for every
node it visits, whatever the node's op: quadratic in the graph. On a 22-layer decoder (1,600
nodes) the one default rule of this kind took 1.6 s a round, and the optimiser runs two rounds,
where it matched nothing. A match pairs the visited node with the first output node, so a node of
another op cannot match; skipping it first leaves every match, and every rewrite, as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager


def _first_output_op(rule) -> tuple[str, str] | None:
    """(domain, op type) of the first output node of a rule with several, else None."""
    outputs = getattr(getattr(rule, "_target_pattern", None), "output_nodes", None)
    if not outputs or len(outputs) < 2:
        return None
    identifier = outputs[0].op_identifier()
    return None if identifier is None else (_domain(identifier[0]), identifier[1])


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@contextmanager
def tried_at_their_first_op(rules: Iterable) -> Iterator[None]:
    """Within: each rule with several output nodes tries only nodes of its first output's op."""
    guarded = []  # (rule, the try_rewrite its instance held before, if any)
    for rule in rules:
        first = _first_output_op(rule)
        if first is None:
            continue

        def try_rewrite(model, graph, node, *args, _first=first, _try=rule.try_rewrite, **kwargs):
            if (_domain(node.domain), node.op_type) != _first:
                return None
            return _try(model, graph, node, *args, **kwargs)

        guarded.append((rule, vars(rule).get("try_rewrite")))
        rule.try_rewrite = try_rewrite  # on the instance, undone on the way out
    try:
        yield
    finally:
        for rule, before in reversed(guarded):
            if before is None:
                del rule.try_rewrite
            else:
                rule.try_rewrite = before
