"""coremltools' walk over the whole program at the end of every pass, skipped where it has nothing to find.

Each coremltools pass runs inside ``with block:``, and leaving a block recomputes, for every var of
the program, the set of "nonreplaceable" vars upstream of it (the outputs of ``constexpr_`` ops:
compressed weights, which a pass must not replace by a plain value). On a conv net of 100 ops
that is about a tenth of the pass pipeline's time, and for a program without ``constexpr_`` ops
every set it computes is the empty set each var already holds (a set is nonempty only downstream
of a ``constexpr_`` op, and a new var is given its set as it is made).
:func:`propagated_only_when_needed` checks once that every set of a function is empty, and then at
each exit only that no ``constexpr_`` op has appeared: while none has, the walk would change
nothing and is skipped; from the first one on it runs as coremltools wrote it. Only this
program's function blocks are patched (an attribute on the instance), so other programs and
threads are untouched.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def propagated_only_when_needed(program):
    """Within: leaving one of ``program``'s function blocks skips the propagation when it would
    leave every var's set empty, as it is."""
    functions = list(program.functions.values())
    for function in functions:
        function._propagate_nonreplaceable_vars = _skipping_when_empty(function)
    try:
        yield program
    finally:
        for function in functions:
            del function._propagate_nonreplaceable_vars


def _skipping_when_empty(function):
    propagate = type(function)._propagate_nonreplaceable_vars
    empty = [not _holds_nonreplaceable(function)]  # every var's set empty, and no constexpr_ op

    def propagate_unless_empty() -> None:
        if empty[0] and not _has_constexpr(function):
            return
        empty[0] = False
        propagate(function)

    return propagate_unless_empty


def _has_constexpr(block) -> bool:
    for op in block.operations:
        if op.op_type.startswith("constexpr_"):
            return True
        for inner in op.blocks:
            if _has_constexpr(inner):
                return True
    return False


def _holds_nonreplaceable(block) -> bool:
    """Whether an op in ``block`` (nested blocks included) is a ``constexpr_`` op or has an output
    with a nonempty nonreplaceable set; block inputs never get one (only op outputs are set)."""
    for op in block.operations:
        if op.op_type.startswith("constexpr_"):
            return True
        for output in op.outputs or ():
            if output.nonreplaceable_vars_upstream:
                return True
        for inner in op.blocks:
            if _holds_nonreplaceable(inner):
                return True
    return False
