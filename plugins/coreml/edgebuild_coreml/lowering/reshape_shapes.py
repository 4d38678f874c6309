"""Reshape output shapes of symbolic inputs worked out by division instead of sympy's solver.

coremltools infers a ``reshape`` of an input with a symbolic shape (a decoder's query length, a
sequence length) by turning a ``-1`` into a fresh symbol and calling ``sympy.solve`` on
"input volume = output volume" for every symbolic output dim. It does so every time the op's
type is inferred: when the lowering builds it, in every pass that rebuilds an op behind it, and
in every specialisation of a compute plan. On a 22-layer decoder that is thousands of solves,
a tenth of a conversion.

The cases a lowering emits have a direct answer. When every symbolic output dim already appears
in the input's volume, either the volumes are equal as they stand (no ``-1``) or the ``-1`` is
the input's volume over the other dims, a monomial quotient sympy cancels on construction (its
coefficient may be a fraction, as the solver's answer is). When a ``-1`` comes with a run-time
size the input's shape does not name, the solver finds nothing it may take, and the ``-1``
stays a fresh symbol.
``solving_reshapes_directly`` answers those by division, the answer ``solve`` reaches, and
leaves every other case (a dim of a fresh symbol, a quotient that is not a polynomial of the
input's symbols) to coremltools' own method.
"""

from __future__ import annotations

import contextlib

import numpy as np


def direct_shape(in_shape, target) -> list | None:
    """``reshape``'s output shape for an input of ``in_shape`` and a target shape ``target``
    (ints, symbols, at most one ``-1``), or None when the answer needs the solver."""
    import sympy

    from coremltools.converters.mil.mil import get_new_symbol
    from coremltools.converters.mil.mil.types.symbolic import is_symbolic

    volume = np.prod(in_shape)
    known = list(volume.free_symbols) if is_symbolic(volume) else []
    dims = list(target)
    unknown = [i for i, d in enumerate(dims) if not is_symbolic(d) and d == -1]
    if len(unknown) > 1:
        return None
    foreign = [d for d in dims if is_symbolic(d) and not d.free_symbols <= set(known)]
    if foreign:  # a run-time size the input's shape does not name
        if not unknown or not all(isinstance(d, sympy.Symbol) for d in dims if is_symbolic(d)):
            return None  # the solver may relate it to the input
        # Every solution the solver finds has the -1's fresh symbol or this size in it: none is taken.
        dims[unknown[0]] = get_new_symbol()
        return dims
    others = np.prod([d for i, d in enumerate(dims) if i not in unknown]) if dims else 1
    if not unknown:
        return dims if sympy.expand(volume - others) == 0 else None
    quotient = sympy.sympify(volume) / sympy.sympify(others)
    if quotient.is_Integer and quotient > 0:
        dims[unknown[0]] = int(quotient)
        return dims
    _, denominator = sympy.fraction(quotient)  # a rational coefficient is fine (heads / 2, say)
    if denominator.free_symbols or not quotient.free_symbols or not quotient.is_polynomial(*quotient.free_symbols):
        return None
    dims[unknown[0]] = quotient
    return dims


@contextlib.contextmanager
def solving_reshapes_directly():
    """Within: coremltools' ``reshape`` infers symbolic output shapes with ``direct_shape`` where
    it can (a class attribute of coremltools, restored after; the lower stages that run
    coremltools take turns: ``Stage.extra["exclusive"]``)."""
    from coremltools.converters.mil.mil.ops.defs.iOS15.tensor_transformation import reshape

    solve = reshape._infer_shape_dynamic

    def infer(op):
        shape = op.shape.sym_val
        direct = None if shape is None else direct_shape(op.x.shape, shape)
        return direct if direct is not None else solve(op)

    reshape._infer_shape_dynamic = infer
    try:
        yield
    finally:
        reshape._infer_shape_dynamic = solve
