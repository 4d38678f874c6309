"""Rules with several output nodes, tried only where their first output's op is.

onnxscript matches a pattern with several outputs (``SlicesSplit``: two Slices of one value) by
indexing every node of the graph by op and then trying the combinations, and does that for every
node it visits, whatever the node's op: quadratic in the graph. On a 22-layer decoder (1,600
nodes) the one default rule of this kind took 1.6 s a round, and the optimiser runs two rounds,
where it matched nothing. A match pairs the visited node with the first output node, so a node of
another op cannot match; skipping it first leaves every match, and every rewrite, as it was.
"""

from __future__ import annotations

import threading
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


_lock = threading.Lock()
_holders: dict[int, int] = {}  # id(rule) -> scopes open on it (builds optimising side by side share rules)
_before: dict[int, object] = {}  # id(rule) -> the try_rewrite its instance held before the first scope


@contextmanager
def tried_at_their_first_op(rules: Iterable) -> Iterator[None]:
    """Within: each rule with several output nodes tries only nodes of its first output's op.

    The guard goes on the rule instance with the first scope open on it and comes off with the
    last (onnxscript's default rules are shared by every thread of the process)."""
    guarded = [rule for rule in rules if _first_output_op(rule) is not None]
    with _lock:
        for rule in guarded:
            if _holders.get(id(rule), 0) == 0:
                _before[id(rule)] = vars(rule).get("try_rewrite")
                rule.try_rewrite = _guard(rule.try_rewrite, _first_output_op(rule))
            _holders[id(rule)] = _holders.get(id(rule), 0) + 1
    try:
        yield
    finally:
        with _lock:
            for rule in guarded:
                _holders[id(rule)] -= 1
                if _holders[id(rule)] == 0:
                    del _holders[id(rule)]
                    before = _before.pop(id(rule))
                    if before is None:
                        del rule.try_rewrite
                    else:
                        rule.try_rewrite = before


def _guard(try_rewrite, first: tuple[str, str]):
    def guarded(model, graph, node, *args, **kwargs):
        if (_domain(node.domain), node.op_type) != first:
            return None
        return try_rewrite(model, graph, node, *args, **kwargs)

    return guarded
