"""ONNX graph (onnx_ir) -> pymil Program: one lowering per node, inside one MIL function.

The walk is: check every op has a lowering (one error listing them all), turn initializers
and ``Constant`` nodes into numpy constants, graph inputs into placeholders, lower each node
in topological order, and bind graph outputs under valid Core ML names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import coremltools as ct
import numpy as np
import onnx_ir as ir
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program, get_new_symbol, types
from coremltools.converters.mil.mil.var import Var

from edgebuild.plugin import BuildError, EdgebuildError, report_progress
from edgebuild.plugin.graph import declined_reason
from edgebuild_coreml.lowering.context import LoweringContext, unique_identifier
from edgebuild_coreml.lowering.errors import DeclinedForm, LoweringError, support_check
from edgebuild_coreml.lowering.names import artifact_names, sanitized
from edgebuild_coreml.lowering.op_names import names_from_zero
from edgebuild_coreml.lowering.ops._util import empty_of

BACKEND = "coreml"
CONVERTER_HANDLED = {("", "Constant")}  # ops the converter turns into constants itself


@dataclass
class ConvertResult:
    """The lowered program and how ONNX names map to its (identifier-safe) names."""

    program: Program
    input_names: dict[str, str] = field(default_factory=dict)  # ONNX name -> MIL name
    output_names: dict[str, str] = field(default_factory=dict)
    op_counts: dict[str, int] = field(default_factory=dict)  # MIL op type -> count in "main"
    input_dtypes: dict[str, str] = field(default_factory=dict)  # MIL name -> MIL dtype string
    # MIL name -> placeholder shape (ints, or None for a flexible dim). Rank-0 ONNX inputs
    # are fed as shape (1,), since Core ML inputs need a rank.
    input_shapes: dict[str, tuple] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # for the report: what the lowering had to give up
    # A generative recipe's stateful program (lowering.stateful.StatefulPlan), else None.
    stateful: object = None


# -- names ----------------------------------------------------------------------------------
def sanitize_name(name: str, taken: set[str]) -> str:
    """A name Core ML accepts for ``name``, not in ``taken`` (which it is then added to)."""
    return sanitized(name, taken)


# -- dtypes ---------------------------------------------------------------------------------
_PLACEHOLDER_DTYPES = {
    ir.DataType.FLOAT: types.fp32,
    ir.DataType.DOUBLE: types.fp32,  # Core ML has no float64
    ir.DataType.FLOAT16: types.fp16,
    ir.DataType.INT64: types.int32,  # Core ML has no int64
    ir.DataType.INT32: types.int32,
    ir.DataType.INT16: types.int32,
    ir.DataType.INT8: types.int32,
    ir.DataType.UINT8: types.int32,
    ir.DataType.INT4: types.int32,
    ir.DataType.UINT4: types.int32,
    ir.DataType.UINT16: types.int32,
    ir.DataType.UINT32: types.int32,
    ir.DataType.UINT64: types.int32,  # like int64: values must fit int32
    ir.DataType.INT4: types.int32,
    ir.DataType.UINT4: types.int32,
    ir.DataType.INT2: types.int32,
    ir.DataType.UINT2: types.int32,
    ir.DataType.BOOL: types.int32,  # Core ML inputs carry no bool; cast inside the program
}

MIL_DTYPE_NAMES = {types.fp32: "fp32", types.fp16: "fp16", types.int32: "int32", types.bool: "bool"}


def placeholder_dtype(value: ir.Value):
    dtype = value.dtype
    if dtype is None:
        return types.fp32
    if dtype not in _PLACEHOLDER_DTYPES:
        raise BuildError(
            f"graph input {value.name!r} has type {dtype.name}, which Core ML inputs cannot carry",
            hint="cast the input to float32 or int32 in the source model",
        )
    return _PLACEHOLDER_DTYPES[dtype]


# -- unsupported-op scan --------------------------------------------------------------------
def _subgraphs(node: ir.Node) -> Iterable[ir.Graph]:
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            yield attribute.value
        elif attribute.type == ir.AttributeType.GRAPHS:
            yield from attribute.value


def iter_nodes(graph: ir.Graph) -> Iterable[ir.Node]:
    """Every node of ``graph`` and, recursively, of its If/Loop/Scan bodies."""
    for node in graph:
        yield node
        for sub in _subgraphs(node):
            yield from iter_nodes(sub)


def opset_of(model: ir.Model, domain: str) -> int:
    domain = "" if domain in ("ai.onnx", None) else domain
    opsets = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}
    if domain in opsets:
        return opsets[domain]
    return opsets.get("", 1) if domain == "" else 1


def find_unsupported(model: ir.Model, registry) -> list[dict]:
    """One entry per (domain, op type) with no lowering: opset, count and the first node names.
    A node a graph pass declined (``mark_declined``) is not here: :func:`find_declined` names it."""
    missing: dict[tuple[str, str], dict] = {}
    for node in iter_nodes(model.graph):
        domain = "" if node.domain in ("ai.onnx", None) else node.domain
        if (domain, node.op_type) in CONVERTER_HANDLED:
            continue
        opset = opset_of(model, domain)
        if registry.lowering(BACKEND, node.op_type, domain, opset) is not None or declined_reason(node):
            continue
        entry = missing.setdefault(
            (domain, node.op_type),
            {"op_type": node.op_type, "domain": domain, "opset": opset, "count": 0, "nodes": []},
        )
        entry["count"] += 1
        if len(entry["nodes"]) < 3:
            entry["nodes"].append(node.name or "<unnamed>")
    return sorted(missing.values(), key=lambda e: (e["domain"], e["op_type"]))


def find_declined(model: ir.Model, registry) -> list[dict]:
    """One entry per node whose form is declined before lowering: by its lowering's support check
    (``errors.declines``), or, for an op with no lowering, by the graph pass that left it (its mark).
    Each is {"node", "op_type", "domain", "reason", "by": "lowering" | "pass"}."""
    declined = []
    for node in iter_nodes(model.graph):
        domain = "" if node.domain in ("ai.onnx", None) else node.domain
        if (domain, node.op_type) in CONVERTER_HANDLED:
            continue
        fn = registry.lowering(BACKEND, node.op_type, domain, opset_of(model, domain))
        check = support_check(fn) if fn is not None else None
        reason, by = (check(node), "lowering") if check is not None else (None, "lowering")
        if fn is None and declined_reason(node):
            reason, by = declined_reason(node), "pass"
        if reason:
            declined.append({"node": node.name or "<unnamed>", "op_type": node.op_type, "domain": domain,
                             "reason": reason, "by": by})
    return declined


def _qualified(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain else op_type


DECLINED_HINT = (
    "the op has a Core ML lowering, but not for this form: change the form as the reason says, route the node "
    "to another backend with the recipe's compute policy, or have a plugin rewrite the form into ops that lower "
    "(a graph pass: implement edgebuild_register_passes, see docs/plugins.md)"
)
MISSING_HINT = (
    "add a lowering in a plugin: implement the hook edgebuild_register_lowerings and call "
    "register('coreml', op_type, fn, domain=..., since=...) (see docs/plugins.md), "
    "or route these ops to another backend with the recipe's compute policy"
)


def declined_line(entry: dict) -> str:
    what = "the Core ML lowering declines this form" if entry["by"] == "lowering" else \
        "no Core ML lowering for this form: the graph pass that rewrites the op declined it"
    return f"node {entry['node']!r} ({_qualified(entry['domain'], entry['op_type'])}): {what}: {entry['reason']}"


class UnsupportedOps(LoweringError):
    """Ops with no Core ML lowering (``missing``) and nodes whose form a lowering or a pass declines
    (``declined``), all named in one error before anything is lowered."""

    def __init__(self, message: str, *, hint: str | None = None, missing=(), declined=()):
        super().__init__(message, hint=hint)
        self.missing, self.declined = list(missing), list(declined)


def unsupported_error(missing: list[dict], declined: list[dict] = ()) -> BuildError:
    lines = []
    if len(declined) == 1 and not missing:
        lines.append(declined_line(declined[0]))
    elif declined:
        lines.append(f"{len(declined)} node(s) have a Core ML lowering that declines their form:")
        lines.extend(f"  - {declined_line(e)}" for e in declined[:10])
        if len(declined) > 10:
            lines.append(f"  - ... and {len(declined) - 10} more")
    if missing:
        lines.append(f"{len(missing)} op type(s) have no Core ML lowering:")
    for e in missing:
        lines.append(
            f"  - {_qualified(e['domain'], e['op_type'])} (opset {e['opset']}): {e['count']} node(s), "
            f"e.g. {', '.join(e['nodes'])}"
        )
    hint = "; ".join(h for h, present in ((DECLINED_HINT, declined), (MISSING_HINT, missing)) if present)
    return UnsupportedOps("\n".join(lines), hint=hint, missing=missing, declined=declined)


# -- constants ------------------------------------------------------------------------------
def constant_node_value(node: ir.Node) -> np.ndarray:
    """The value of an ONNX ``Constant`` node, whichever attribute carries it."""
    for name, attribute in node.attributes.items():
        value = attribute.value
        if name == "value":
            return value.numpy()
        if name == "value_float":
            return np.array(value, dtype=np.float32)
        if name == "value_floats":
            return np.array(list(value), dtype=np.float32)
        if name == "value_int":
            return np.array(value, dtype=np.int64)
        if name == "value_ints":
            return np.array(list(value), dtype=np.int64)
    raise LoweringError(
        f"{LoweringContext.where(node)}: only tensor, float and int constants are supported "
        "(strings and sparse tensors have no Core ML equivalent)"
    )


# -- the walk -------------------------------------------------------------------------------
def _as_var(value, name: str | None = None) -> Var:
    if isinstance(value, Var):
        return value
    array = np.asarray(value)
    array = LoweringContext.int32(array) if array.dtype == np.int64 else array
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    return mb.const(val=array, name=name) if name else mb.const(val=array)


def _bind_outputs(ctx: LoweringContext, node: ir.Node, result) -> None:
    outputs = list(node.outputs)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    while len(result) > len(outputs) and result[-1] is None:
        result = result[:-1]
    if len(result) > len(outputs):
        ctx.fail(node, f"the lowering produced {len(result)} outputs but the node has {len(outputs)}")
    for value, produced in zip(outputs, result):
        if value is None or value.name == "":
            continue
        if produced is None:
            if value.uses() or value.is_graph_output():
                ctx.fail(node, f"optional output {value.name!r} is used but the lowering does not produce it")
            continue
        empty = empty_of(produced.shape, produced) if isinstance(produced, Var) else None
        if empty is not None:  # no elements: a constant, so no zero-size tensor reaches the program
            ctx.consts[value.name] = empty
        elif isinstance(produced, Var):
            ctx.set(value, produced)
        else:
            ctx.consts[value.name] = np.asarray(produced)
    for value in outputs[len(result):]:
        if value is not None and value.name and (value.uses() or value.is_graph_output()):
            ctx.fail(node, f"output {value.name!r} is used but the lowering does not produce it")


def _declined(exc: DeclinedForm, node: ir.Node, owner: str | None = None) -> DeclinedForm:
    """A lowering's decline worded as one: who declines, the node, the reason, and how to get past it."""
    if " declines this form: " in exc.message:  # worded already, by a node in a subgraph of this one
        return exc
    where = LoweringContext.where(node)
    reason = exc.message.removeprefix(f"{where}: ")
    who = f"the lowering from {owner}" if owner else "the Core ML lowering"
    message = f"{where}: {who} declines this form: {reason}"
    hint = f"{exc.hint}; or: {DECLINED_HINT}" if exc.hint else DECLINED_HINT
    return DeclinedForm(message, hint=hint, node=node.name, op_type=node.op_type, domain=node.domain,
                        reason=exc.reason)


def _renamed(exc: EdgebuildError, node: ir.Node, owner: str | None = None) -> EdgebuildError:
    """``exc`` with the node named in its message, and ``owner``, the plugin whose lowering raised it
    (None: this backend's own), in front of the reason (same class, same hint)."""
    where = LoweringContext.where(node)
    if where in exc.message and owner is None:
        return exc
    reason = exc.message.removeprefix(f"{where}: ")
    message = f"{where}: the lowering from {owner} failed: {reason}" if owner else f"{where}: {reason}"
    try:
        renamed = type(exc)(message, hint=exc.hint)
    except TypeError:
        renamed = BuildError(message, hint=exc.hint)
    return renamed


def lowering_owner(registry, node: ir.Node, opset: int) -> str | None:
    """The plugin that registered ``node``'s lowering, in words ("plugin 'swish' (edgebuild-swish 0.1.0)"),
    or None when it is this backend's own plugin: an error in a lowering names who to ask."""
    import importlib.metadata as md

    table = registry.tables["lowerings"].get(BACKEND)
    entry = table.entry(node.op_type, domain=node.domain, opset=opset) if table is not None else None
    if entry is None:
        return None
    own = registry.plugin_of("backends", BACKEND)
    info = next((info for name, info in registry.plugins.items() if entry.owner == f"plugin {name!r}"), None)
    if info is None:
        return entry.owner
    if own is not None and info.name == own.name:
        return None
    if not info.distribution:
        return entry.owner
    try:
        version = md.version(info.distribution)
    except md.PackageNotFoundError:  # registered in-process (tests): the registry's own version
        version = info.version
    return f"{entry.owner} ({' '.join(filter(None, (info.distribution, version)))})"


def lower_node(ctx: LoweringContext, node: ir.Node) -> None:
    """Lower one node and bind its outputs in ``ctx``."""
    domain = "" if node.domain in ("ai.onnx", None) else node.domain
    if (domain, node.op_type) == ("", "Constant"):
        ctx.consts[node.outputs[0].name] = constant_node_value(node)
        return
    fn = ctx.lookup(node)
    if fn is None:  # only reachable for subgraphs built after the scan
        raise unsupported_error(
            [{"op_type": node.op_type, "domain": domain, "opset": ctx.opset_for(domain), "count": 1, "nodes": [node.name]}]
        )
    try:
        result = fn(ctx, node)
        _bind_outputs(ctx, node, result)
    except DeclinedForm as exc:  # the lowering declined the node's form (ctx.decline)
        raise _declined(exc, node, ctx.owner_of(node)) from exc
    except EdgebuildError as exc:  # another unsupported case (a target too old, a value out of range)
        raise _renamed(exc, node, ctx.owner_of(node)) from exc
    except Exception as exc:  # a lowering bug or a MIL type error: name the node, and a plugin's lowering its plugin
        owner = ctx.owner_of(node)
        if owner is None:
            raise LoweringError(
                f"{LoweringContext.where(node)}: lowering failed: {type(exc).__name__}: {exc}",
                hint="this is a bug in the lowering or an unsupported attribute combination; "
                "report it with the model, or route the op to another backend",
            ) from exc
        raise LoweringError(
            f"{LoweringContext.where(node)}: the lowering from {owner} failed: {type(exc).__name__}: {exc}",
            hint=f"this is a bug in {owner} or an attribute combination it does not support: report it to "
            "that plugin's authors with the model, or uninstall the plugin",
        ) from exc


def _load_initializers(ctx: LoweringContext, graph: ir.Graph) -> None:
    for name, value in graph.initializers.items():
        if value.const_value is not None:
            ctx.consts[name] = value.const_value.numpy()


def _weights_read_last(graph: ir.Graph) -> dict[int, list[ir.Value]]:
    """{index of a node in ``graph``: initializers of ``graph`` no later node (or subgraph) reads}."""
    last_reader: dict[str, tuple[int, ir.Value]] = {}
    for index, node in enumerate(graph):
        for reader in (node, *(inner for sub in _subgraphs(node) for inner in iter_nodes(sub))):
            for value in reader.inputs:
                if value is not None and graph.initializers.get(value.name) is value:
                    last_reader[value.name] = (index, value)
    released: dict[int, list[ir.Value]] = {}
    for index, value in last_reader.values():
        if not value.is_graph_output():
            released.setdefault(index, []).append(value)
    return released


def _release_weight(ctx: LoweringContext, value: ir.Value) -> None:
    """Forget a weight every reader has lowered, and unmap its file pages.

    Lowerings that change a weight's values or dtype copy it into a MIL constant; the
    memory-mapped original would otherwise stay resident too until the conversion ends. A weight a
    lowering keeps as a view of the mapping (MatMul's, transposed) stays mapped by that view only.
    """
    ctx.consts.pop(value.name, None)
    tensor = value.const_value
    if isinstance(tensor, ir.ExternalTensor):
        try:
            tensor.release()  # reloaded lazily if anyone reads it again
        except BufferError:
            # A MIL constant views the mapping (a weight used as stored): the tensor lets go of it,
            # and the map closes when the last view does (after the fp16 cast or the save).
            if hasattr(tensor, "_array") and hasattr(tensor, "raw"):
                tensor._array, tensor.raw = None, None


def lower_subgraph(ctx: LoweringContext, graph: ir.Graph, inputs: Sequence) -> list[Var]:
    """Lower a nested graph (If/Loop body) into the MIL block currently open.

    ``inputs`` binds ``graph.inputs`` in order. Outer-scope values stay visible; the
    subgraph's own names are forgotten afterwards. Returns one Var per graph output
    (outer values passed straight through are wrapped in an identity, as blocks need).
    """
    saved_vars, saved_consts = dict(ctx.vars), dict(ctx.consts)
    try:
        _load_initializers(ctx, graph)
        for value, var in zip(graph.inputs, inputs):
            if isinstance(var, Var):
                ctx.set(value, var)
            else:
                ctx.consts[value.name] = np.asarray(var)
        local_names = {v.name for v in graph.inputs}
        for node in graph:
            lower_node(ctx, node)
            local_names.update(o.name for o in node.outputs if o is not None)
        results = []
        for value in graph.outputs:
            produced = ctx.get(value)
            if not isinstance(produced, Var):
                produced = _as_var(produced)
            elif value.name not in local_names:
                produced = mb.identity(x=produced)
            results.append(produced)
        return results
    finally:
        ctx.vars, ctx.consts = saved_vars, saved_consts


def _input_shape(value: ir.Value, override, symbols: dict[str, object]) -> tuple:
    dims = list(override) if override is not None else (list(value.shape) if value.shape is not None else None)
    if dims is None:
        raise BuildError(
            f"graph input {value.name!r} has no shape",
            hint="give its shape in the recipe's source.inputs",
        )
    shape = []
    for dim in dims:
        if isinstance(dim, (int, np.integer)) and dim >= 0:
            shape.append(int(dim))
            continue
        key = str(getattr(dim, "value", dim)) if dim is not None else None
        if key and key != "None":  # the same named dim is the same symbol
            shape.append(symbols.setdefault(key, get_new_symbol()))
        else:
            shape.append(get_new_symbol())
    return tuple(shape)


def convert(
    model: ir.Model,
    *,
    target: str = "iOS17",
    precision: str = "float32",
    registry=None,
    input_shapes: dict | None = None,
    generate: dict | None = None,
) -> ConvertResult:
    """Lower ``model`` to a pymil Program with one function, ``main``.

    ``input_shapes`` overrides graph input shapes ({onnx name: dims}); a dim that is None
    or a string stays symbolic (package.py turns those into ranges or enumerations).
    ``generate``: the recipe's generate section; the decoder is then wrapped as a stateful
    program (``lowering.stateful``) whose KV cache lives in Core ML states.
    """
    if registry is None:
        from edgebuild.plugin import get_registry

        registry = get_registry()
    graph = model.graph
    missing, declined = find_unsupported(model, registry), find_declined(model, registry)
    if missing or declined:
        raise unsupported_error(missing, declined)
    graph.sort()
    names_from_zero()  # the same program, the same op names: in any process, beside any thread

    ctx = LoweringContext(opset_of(model, ""), target=target, precision=precision)
    ctx.opset_for = lambda domain: opset_of(model, domain)
    ctx.lookup = lambda node: registry.lowering(BACKEND, node.op_type, node.domain, opset_of(model, node.domain))
    ctx.owner_of = lambda node: lowering_owner(registry, node, opset_of(model, node.domain))
    ctx.lower_subgraph = lambda sub, inputs: lower_subgraph(ctx, sub, inputs)
    _load_initializers(ctx, graph)

    result = ConvertResult(program=Program())
    placeholders = {}
    symbols: dict[str, object] = {}
    fed = [value for value in graph.inputs if value.name not in ctx.consts]  # not initializers listed as inputs
    if generate is not None:
        return _convert_stateful(model, ctx, result, generate)
    result.input_names, result.output_names = artifact_names([v.name for v in fed], [v.name for v in graph.outputs])
    for value in fed:
        mil_name = result.input_names[value.name]
        override = (input_shapes or {}).get(value.name)
        shape = _input_shape(value, override, symbols) or (1,)  # Core ML inputs have rank >= 1
        placeholders[mil_name] = mb.placeholder(shape=shape, dtype=placeholder_dtype(value))
        result.input_dtypes[mil_name] = MIL_DTYPE_NAMES[placeholder_dtype(value)]
        result.input_shapes[mil_name] = tuple(d if isinstance(d, int) else None for d in shape)
    ctx.reserve({*result.input_names.values(), *result.output_names.values()})

    with Function(placeholders, opset_version=getattr(ct.target, target)) as function:
        for value in graph.inputs:
            if value.name in result.input_names:
                var = function.inputs[result.input_names[value.name]]
                if value.shape is not None and value.shape.rank() == 0 and value.name not in (input_shapes or {}):
                    var = mb.squeeze(x=var, name=ctx.name_for(value.name, "scalar"))
                if value.dtype == ir.DataType.BOOL:
                    var = mb.cast(x=var, dtype="bool", name=ctx.name_for(value.name, "as_bool"))
                ctx.set(value, var)
        _lower_nodes(ctx, graph)
        outputs = _bind_graph_outputs(ctx, graph.outputs, result.output_names)
        function.set_outputs(outputs)
    return _finish(result, function, ctx, graph)


def _lower_nodes(ctx: LoweringContext, graph: ir.Graph) -> None:
    """Lower every node of ``graph``. A node whose form its lowering declines does not stop the walk:
    the nodes that read what it would make are skipped, the others lowered, so one error names every
    declined node that does not follow from another."""
    release_after = _weights_read_last(graph)
    declined: list[DeclinedForm] = []
    unmade: set[str] = set()  # outputs of declined (or skipped) nodes
    for index, node in enumerate(graph):
        if unmade and any(name in unmade for name in _names_read(node)):
            unmade.update(value.name for value in node.outputs if value is not None)
        else:
            try:
                lower_node(ctx, node)
            except DeclinedForm as exc:
                declined.append(exc)
                unmade.update(value.name for value in node.outputs if value is not None)
            except EdgebuildError:
                if not declined:
                    raise
                break  # after a declined node, the declines are the error to fix first
        for value in release_after.get(index, ()):
            _release_weight(ctx, value)
        report_progress("ops lowered", index + 1, len(graph))
    if len(declined) == 1:
        raise declined[0]
    if declined:
        raise declined_together(declined)


def _names_read(node: ir.Node) -> set[str]:
    """Values ``node`` reads, its subgraphs' reads of outer values included."""
    names = {value.name for value in node.inputs if value is not None}
    for sub in _subgraphs(node):
        for inner in iter_nodes(sub):
            names.update(value.name for value in inner.inputs if value is not None)
    return names


def declined_together(declined: list[DeclinedForm]) -> UnsupportedOps:
    """One error for several nodes whose lowering declined their form (each already worded by
    :func:`_declined`), their specific hints first."""
    lines = [f"{len(declined)} node(s) have a Core ML lowering that declines their form:"]
    lines.extend(f"  - {exc.message}" for exc in declined[:10])
    if len(declined) > 10:
        lines.append(f"  - ... and {len(declined) - 10} more")
    specific = dict.fromkeys(part for exc in declined if exc.hint
                             for part in exc.hint.split("; or: ") if part != DECLINED_HINT)
    entries = [{"node": exc.node, "op_type": exc.op_type, "domain": exc.domain, "reason": exc.reason, "by": "lowering"}
               for exc in declined]
    return UnsupportedOps("\n".join(lines), hint="; ".join([*specific, DECLINED_HINT]), declined=entries)


def _bind_graph_outputs(ctx: LoweringContext, values, output_names: dict, shape=None) -> list[Var]:
    outputs = []
    for value in values:
        mil_name = output_names[value.name]
        produced = ctx.get(value)
        if isinstance(produced, Var):
            outputs.append(mb.identity(x=shape(value, produced) if shape else produced, name=mil_name))
        else:
            outputs.append(_as_var(produced, name=mil_name))
    return outputs


def _finish(result: ConvertResult, function, ctx: LoweringContext, graph: ir.Graph) -> ConvertResult:
    from edgebuild_coreml.lowering.rank import legalise_ranks, onnx_node_namer

    legalise_ranks(function, where=onnx_node_namer(graph))  # Core ML holds rank <= 5
    result.program.add_function("main", function)
    result.op_counts = dict(Counter(op.op_type for op in function.operations))
    result.notes = [f"{message} ({count} ops)" if count > 1 else message for message, count in ctx.notes.items()]
    return result


def _convert_stateful(model: ir.Model, ctx: LoweringContext, result: ConvertResult, generate: dict) -> ConvertResult:
    """The decoder wrapped as a stateful program: input_ids and position in, logits out, cache in states."""
    from edgebuild_coreml.lowering import stateful

    graph = model.graph
    taken = {stateful.INPUT_IDS, stateful.POSITION}
    plan = stateful.plan_for(graph, generate, taken)
    result.stateful = plan
    result.input_names = {stateful.INPUT_IDS: stateful.INPUT_IDS, stateful.POSITION: stateful.POSITION}
    result.input_dtypes = {stateful.INPUT_IDS: "int32", stateful.POSITION: "int32"}
    result.input_shapes = {stateful.INPUT_IDS: (1, None), stateful.POSITION: (1,)}
    _, result.output_names = artifact_names([*taken, *plan.states.values()], [v.name for v in graph.outputs])
    ctx.reserve({*taken, *plan.states.values(), *result.output_names.values()})
    with Function(stateful.placeholders(plan), opset_version=getattr(ct.target, ctx.target)) as function:
        wrapper = stateful.StatefulWrapper(plan, function, graph)
        wrapper.bind_inputs(ctx)
        _lower_nodes(ctx, graph)
        wrapper.write_states(ctx)
        kept = wrapper.output_values()
        result.output_names = {v.name: result.output_names[v.name] for v in kept}
        function.set_outputs(_bind_graph_outputs(ctx, kept, result.output_names, shape=wrapper.shape_output))
    return _finish(result, function, ctx, graph)
