"""``sort``: one or more operands ordered by the first, ascending or descending.

The comparator region is read, not run: its returned ``compare`` must order the first operand's
two block arguments (LT ascending, GT descending), either directly or through JAX's total-order
canonicalisation of floats (selects that map -0.0 to 0.0 and NaNs to one NaN). That becomes ONNX
TopK over the whole dimension (k its run-time size when the dim is symbolic); the other
operands follow by GatherElements on its indices.
``jax.lax.top_k`` arrives as a composite whose decomposition is such a sort and a slice.
"""

from __future__ import annotations

from edgebuild_jax.convert.dynamic import sizes_of
from edgebuild_jax.convert.registry import converts

CANONICALISING = {"stablehlo.select", "stablehlo.compare", "stablehlo.constant", "stablehlo.broadcast_in_dim"}


def arguments_used(value, arguments) -> set[int] | None:
    """Which block arguments ``value`` is computed from, through the canonicalising ops only;
    None when another op is in the way."""
    if value in arguments:
        return {arguments.index(value)}
    owner = value.owner
    name = getattr(owner, "name", None)
    if name is None:  # an argument of an enclosing region, or a value from outside
        return set()
    if name not in CANONICALISING:
        return None
    used: set[int] = set()
    for operand in owner.operands:
        found = arguments_used(operand, arguments)
        if found is None:
            return None
        used |= found
    return used


def sort_direction(op) -> str | None:
    """'LT' or 'GT' when the comparator orders the first operand's arguments, else None."""
    block = op.regions[0].blocks[0]
    arguments = list(block.arguments)
    ret = list(block.operations)[-1]
    if len(ret.operands) != 1:
        return None
    compare = ret.operands[0].owner
    if getattr(compare, "name", None) != "stablehlo.compare":
        return None
    direction = str(compare.attributes["comparison_direction"]).split()[-1].rstrip(">")
    lhs, rhs = (arguments_used(v, arguments) for v in compare.operands)
    if direction not in ("LT", "GT") or lhs is None or rhs is None:
        return None
    if (lhs, rhs) == ({1}, {0}):
        return "GT" if direction == "LT" else "LT"
    return direction if (lhs, rhs) == ({0}, {1}) else None


def describe(op) -> str:
    return ", ".join(o.operation.name for o in op.regions[0].blocks[0].operations)


@converts("stablehlo.sort")
def sort(op, cx):
    operands = cx.inputs(op)
    shape = cx.shape(op.operands[0])
    dim = int(op.attributes["dimension"])
    dim = dim + len(shape) if dim < 0 else dim
    direction = sort_direction(op)
    if direction is None:
        raise cx.error(op, f"a sort whose comparator is not LT/GT on the first operand is not supported "
                           f"(comparator: {describe(op)})", hint="sort by one key with jnp.sort / lax.sort")
    # k is the whole dim: its size read at run time when the dim is symbolic
    values, indices = cx.node("TopK", [operands[0], sizes_of(cx, operands[0], op.operands[0], [dim])],
                              {"axis": dim, "largest": int(direction == "GT"), "sorted": 1}, outputs=2)
    results = [values]
    for mlir_value, onnx_value in zip(op.operands[1:], operands[1:]):
        source = mlir_value.owner
        if (getattr(source, "name", None) == "stablehlo.iota"
                and int(source.attributes["iota_dimension"]) == dim):
            # the argsort pattern: the positions themselves
            results.append(cx.node("Cast", [indices], {"to": cx.dtype(mlir_value)}))
        else:
            results.append(cx.node("GatherElements", [onnx_value, indices], {"axis": dim}))
    return results
