"""ONNX graph (onnx_ir) -> MPSGraph :class:`Program`: fold what is static, lower the rest node by node."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError, standard_domain
from edgebuild_mpsgraph.lowering.context import LoweringContext

BACKEND = "mpsgraph"


def _domain(node: ir.Node) -> str:
    return standard_domain(node.domain)


def opset_of(model: ir.Model, domain: str) -> int:
    imports = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}
    return imports.get(domain, 1)


class OwnLowerings:
    """This plugin's lowerings alone, for callers without a registry (tests, scripts): it avoids
    loading every installed plugin's lowerings (and coremltools behind Core ML's)."""

    def lowering(self, backend: str, op_type: str, domain: str, opset: int):
        from edgebuild_mpsgraph.lowering.registry import LOWERINGS

        return LOWERINGS.table.lookup(op_type, domain=domain, opset=opset) if backend == BACKEND else None


def supports(node: ir.Node, model: ir.Model, registry) -> bool:
    """Whether this plugin (or another registering ``mpsgraph`` lowerings) can lower ``node``."""
    domain = _domain(node)
    if (domain, node.op_type) == ("", "Constant"):
        return True
    return registry.lowering(BACKEND, node.op_type, domain, opset_of(model, domain)) is not None


def _static_shape(value: ir.Value) -> list[int]:
    if value.shape is None or any(not isinstance(d, int) for d in value.shape):
        raise BuildError(f"MPSGraph segment input {value.name!r} has no static shape ({value.shape})",
                         hint="pin every dimension in the recipe's source.inputs")
    return list(value.shape)


def _numpy_dtype(value: ir.Value) -> str:
    if value.dtype is None:
        raise BuildError(f"MPSGraph segment input {value.name!r} has no dtype")
    return np.dtype(value.dtype.numpy()).name


def _evaluate_static(node: ir.Node, ctx: LoweringContext, opset: int) -> list[np.ndarray] | None:
    """Build-time outputs of a standard op whose inputs are all known, else None."""
    if _domain(node) != "" or any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                                  for a in node.attributes.values()):
        return None
    if node.op_type == "Shape":
        source = node.inputs[0]
        if source.name in ctx.tensor_of:  # the lowered tensor's shape is exact
            dims = list(ctx.shape(ctx.tensor_of[source.name]))
        elif source.name in ctx.known:
            dims = list(ctx.known[source.name].shape)
        elif source.shape is not None and all(isinstance(d, int) for d in source.shape):
            dims = list(source.shape)
        else:
            return None
        start, end = ctx.attr(node, "start", 0), ctx.attr(node, "end", None)
        return [np.asarray(dims[start:end], dtype=np.int64)]
    present = [v for v in node.inputs if v is not None and v.name]
    if not all(v.name in ctx.known for v in present):
        return None
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    evaluator = ReferenceEvaluator(proto, opsets={"": opset})
    results = evaluator.run(None, {v.name: ctx.known[v.name] for v in present})
    return [np.asarray(r) for r in results]


def unsupported(model: ir.Model, registry) -> list[str]:
    missing = Counter(f"{_domain(n) + '::' if _domain(n) else ''}{n.op_type}" for n in model.graph
                      if not supports(n, model, registry))
    return [f"{op} ({count} node(s))" for op, count in sorted(missing.items())]


def _release_dead(ctx: LoweringContext, node: ir.Node, uses: Counter, outputs: set[str]) -> None:
    """Free placeholder values of tensors no ONNX value still needs (aliases included)."""
    for value in node.inputs:
        if value is None or value.name not in ctx.tensor_of:
            continue
        tensor = ctx.tensor_of[value.name]
        holders = [name for name, t in ctx.tensor_of.items() if t == tensor]
        if all(uses[name] <= 0 and name not in outputs for name in holders):
            ctx.release([tensor])


def lower_model(model: ir.Model, registry=None):
    """Lower every node of ``model`` (static shapes required) to an MPSGraph program.

    ``registry``: edgebuild's registry (every plugin's ``mpsgraph`` lowerings); None uses this
    plugin's own."""
    registry = registry or OwnLowerings()
    graph = model.graph
    graph.sort()
    opset = opset_of(model, "")
    ctx = LoweringContext(opset)
    for name, value in graph.initializers.items():
        ctx.known[name] = value.const_value.numpy()
    for value in graph.inputs:
        if value.name not in ctx.known:
            ctx.add_input(value.name, _numpy_dtype(value), _static_shape(value))
    for node in graph:  # fresh names never take an ONNX value's name
        for value in node.outputs:
            ctx.reserve(value.name)
    uses = Counter(v.name for n in graph for v in n.inputs if v is not None)
    outputs = {v.name for v in graph.outputs}

    for node in graph:
        folded = _evaluate_static(node, ctx, opset)
        if folded is not None:
            for value, result in zip(node.outputs, folded):
                ctx.known[value.name] = result
            continue
        domain = _domain(node)
        fn = registry.lowering(BACKEND, node.op_type, domain, opset_of(model, domain))
        if fn is None:
            raise BuildError(f"node {node.name!r}: {domain + '::' if domain else ''}{node.op_type} has no MPSGraph lowering",
                             hint="route it to another backend (target.options.prefer) or register a lowering "
                                  "with register('mpsgraph', op_type, fn)")
        ctx.begin(node)
        produced = fn(ctx, node)
        produced = produced if isinstance(produced, (list, tuple)) else [produced]
        for value, tensor in zip(node.outputs, produced):
            if tensor is not None:
                ctx.bind(value, tensor)
        for value in node.inputs:
            if value is not None and value.name:
                uses[value.name] -= 1
        _release_dead(ctx, node, uses, outputs)

    for value in graph.outputs:
        tensor = ctx.tensor_of.get(value.name)
        if tensor is None and value.name in ctx.known:
            tensor = ctx.constant(ctx.known[value.name], f"{value.name}_value")
        if tensor is None:
            raise BuildError(f"graph output {value.name!r} is not produced by the segment")
        if tensor != value.name:  # an alias of an input or constant: give the output its own name
            ctx.begin(None)
            ctx.bind(value, ctx.emit("identity", [tensor]))
        ctx.program.outputs.append(value.name)
    return ctx.program
