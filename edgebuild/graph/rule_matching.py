"""Rewrite rules tried only at nodes of their first output node's op.

onnxscript tries every rule at every node it visits, whatever the node's op, and a rule whose
pattern is rooted at another op fails only after building a match, about 30 us a try: on a
100-node conv net its default rules made 10,700 tries a round for a dozen matches (0.2 s of the
optimize stage). A pattern with several outputs (``SlicesSplit``: two Slices of one value) is
worse: it indexes every node of the graph by op and tries the combinations, at every node: on a
22-layer decoder (1,600 nodes) that one default rule took 1.6 s a round. A match pairs the
visited node with the pattern's first output node, so a node of another op cannot match;
skipping it first leaves every match, and every rewrite, as it was. Rules whose first output's
op or domain is itself a pattern are tried everywhere, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from onnxscript.rewriter._pattern_ir import StringConstantPattern


def _first_output_op(rule) -> tuple[str, str] | None:
    """(domain, op type) of the rule's first output node, None when either is a pattern."""
    outputs = getattr(getattr(rule, "_target_pattern", None), "output_nodes", None)
    if not outputs:
        return None
    node = outputs[0]
    identifier = node.op_identifier()
    if identifier is not None:
        return _domain(identifier[0]), identifier[1]
    # the copies ``commute()`` makes (operands swapped) keep the op as a constant pattern but no
    # identifier, and match that one op all the same
    op, domain = getattr(node, "op", None), getattr(node, "domain", None)
    if isinstance(op, StringConstantPattern) and isinstance(domain, StringConstantPattern):
        return _domain(domain.value()), op.value()
    return None


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


_lock = threading.Lock()
_holders: dict[int, int] = {}  # id(rule) -> scopes open on it (builds optimising side by side share rules)
_before: dict[int, object] = {}  # id(rule) -> the try_rewrite its instance held before the first scope


@contextmanager
def tried_at_their_first_op(rules: Iterable) -> Iterator[None]:
    """Within: each rule tries only nodes of its first output's op (where that op is fixed).

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
