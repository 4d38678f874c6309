"""Split a model into segments, each run by one backend (a bundle: Core ML, MPSGraph, Metal kernels).

Backend-agnostic: a backend is a name and a ``supports(node) -> bool``, listed in the
policy's order of preference; a custom op with a kernel of its own always gets a segment of
its own on the kernel backend the caller names. Nodes are scheduled so that each backend's nodes stay
together, then a profitability rule (in the spirit of MetalHLO's gate: a cluster too small,
in ops or estimated work, is not worth a hand-off) merges tiny segments into a neighbour
that can run them. A model one backend fully supports stays one segment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import onnx
import onnx_ir as ir

from edgebuild.errors import BuildError

STANDARD_DOMAINS = ("", "ai.onnx")

Supports = Callable[[ir.Node], bool]


@dataclass
class Segment:
    """Consecutive nodes (graph order) run by one backend, and the values crossing its border."""

    backend: str
    nodes: list[ir.Node]
    inputs: list[str] = field(default_factory=list)  # graph inputs and earlier segments' outputs it reads
    outputs: list[str] = field(default_factory=list)  # values later segments or the graph read
    flops: float = 0.0

    @property
    def op_count(self) -> int:
        return len(self.nodes)

    def op_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            key = f"{node.domain}::{node.op_type}" if node.domain not in STANDARD_DOMAINS else node.op_type
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))


@dataclass
class HandOff:
    """``tensor`` flows from segment ``producer`` (None: a graph input) to ``consumer`` (None: a graph output)."""

    tensor: str
    producer: int | None
    consumer: int | None


def _qualified(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in STANDARD_DOMAINS else node.op_type


def _elements(value: ir.Value | None) -> int:
    if value is None or value.shape is None:
        return 1
    return math.prod(d if isinstance(d, int) else 1 for d in value.shape)


def estimate_flops(node: ir.Node) -> float:
    """Rough work of ``node``: 2*MACs for matmuls and convolutions, one per output element otherwise."""
    out = sum(_elements(v) for v in node.outputs)
    inputs = [v for v in node.inputs]
    if node.op_type in ("MatMul", "Gemm", "Linear") and inputs and inputs[0] is not None and inputs[0].shape:
        k = inputs[0].shape[-1]
        return 2.0 * out * (k if isinstance(k, int) else 1)
    if node.op_type in ("Conv", "ConvTranspose") and len(inputs) > 1 and inputs[1] is not None and inputs[1].shape:
        return 2.0 * out * math.prod(d if isinstance(d, int) else 1 for d in inputs[1].shape[1:])
    if node.op_type == "ScaledDotProductAttention" and inputs[0] is not None and inputs[1] is not None:
        lk = inputs[1].shape[-2] if inputs[1].shape is not None else 1
        return 4.0 * _elements(inputs[0]) * (lk if isinstance(lk, int) else 1)
    return float(out)


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in STANDARD_DOMAINS


def _assign(nodes: list[ir.Node], backends: Sequence[tuple[str, Supports]], kernel_ops,
            kernel_backend: str) -> tuple[dict, dict]:
    """Each node's backend (first in preference that supports it) and every backend able to run it."""
    chosen, able, missing = {}, {}, []
    for node in nodes:
        domain = "" if node.domain in STANDARD_DOMAINS else node.domain
        if (domain, node.op_type) in kernel_ops:
            chosen[node], able[node] = kernel_backend, {kernel_backend}
            continue
        able[node] = {name for name, supports in backends if supports(node)}
        choice = next((name for name, _ in backends if name in able[node]), None)
        if choice is None:
            missing.append(node)
        chosen[node] = choice
    if missing:
        listed = ", ".join(f"{_qualified(n)} {n.name!r}" for n in missing[:5])
        raise BuildError(
            f"{len(missing)} node(s) no preferred backend ({', '.join(n for n, _ in backends)}) can run: {listed}",
            hint="add a backend to target.options.prefer, or install a plugin that lowers these ops")
    return chosen, able


def _schedule(nodes: list[ir.Node], chosen: dict, kernel_backend: str) -> list[list[ir.Node]]:
    """A topological order that keeps each backend's nodes together, cut into runs.

    Kahn's algorithm: among ready nodes, continue with the current run's backend; else take
    the earliest in graph order. A kernel node is always a run of its own.
    """
    order = {node: i for i, node in enumerate(nodes)}
    producers = {v: n for n in nodes for v in n.outputs}
    waiting = {n: {producers[v] for v in n.inputs if v is not None and v in producers} for n in nodes}
    consumers: dict[ir.Node, list[ir.Node]] = {n: [] for n in nodes}
    for node, deps in waiting.items():
        for dep in deps:
            consumers[dep].append(node)
    ready = sorted((n for n, deps in waiting.items() if not deps), key=order.get)
    runs: list[list[ir.Node]] = []
    current = None
    while ready:
        same = [n for n in ready if chosen[n] == current and current != kernel_backend]
        node = same[0] if same else ready[0]
        ready.remove(node)
        if not same:
            runs.append([])
            current = chosen[node]
        runs[-1].append(node)
        for consumer in consumers[node]:
            waiting[consumer].discard(node)
            if not waiting[consumer]:
                ready.append(consumer)
        ready.sort(key=order.get)
    return runs


def _merge_tiny(runs: list[list[ir.Node]], chosen: dict, able: dict, min_ops: int, min_flops: float,
                kernel_backend: str) -> list[tuple[str, list]]:
    """Fold unprofitable segments into a neighbour able to run all their nodes; kernel segments stay."""
    segments = [(chosen[run[0]], run) for run in runs]

    def tiny(segment) -> bool:
        backend, run = segment
        return backend != kernel_backend and (len(run) < min_ops or sum(estimate_flops(n) for n in run) < min_flops)

    def can_run(backend, run) -> bool:
        return backend != kernel_backend and all(backend in able[n] for n in run)

    changed = True
    while changed and len(segments) > 1:
        changed = False
        for i, segment in enumerate(segments):
            if not tiny(segment):
                continue
            before = segments[i - 1] if i > 0 else None
            after = segments[i + 1] if i + 1 < len(segments) else None
            if before and after and before[0] == after[0] and can_run(before[0], segment[1]):
                segments[i - 1:i + 2] = [(before[0], before[1] + segment[1] + after[1])]
            elif before and after is None and can_run(before[0], segment[1]):
                segments[i - 1:i + 1] = [(before[0], before[1] + segment[1])]
            elif after and before is None and can_run(after[0], segment[1]):
                segments[i:i + 2] = [(after[0], segment[1] + after[1])]
            else:
                continue
            changed = True
            break
    return segments


def _borders(segments: list[Segment], graph: ir.Graph, constants: set[str]) -> None:
    """Fill each segment's inputs and outputs (ordered, unique) from who produces and reads what."""
    owner = {v.name: i for i, s in enumerate(segments) for n in s.nodes for v in n.outputs}
    graph_outputs = {v.name for v in graph.outputs}
    readers: dict[str, set[int]] = {}
    for i, segment in enumerate(segments):
        for node in segment.nodes:
            for value in node.inputs:
                if value is None or not value.name or value.name in constants:
                    continue
                readers.setdefault(value.name, set()).add(i)
                if owner.get(value.name) != i and value.name not in segment.inputs:
                    segment.inputs.append(value.name)
    for i, segment in enumerate(segments):
        for node in segment.nodes:
            for value in node.outputs:
                read_elsewhere = readers.get(value.name, set()) - {i}
                if value.name and (read_elsewhere or value.name in graph_outputs):
                    segment.outputs.append(value.name)


def partition(model: ir.Model, backends: Sequence[tuple[str, Supports]],
              kernel_ops: Mapping[tuple[str, str], Any] | None = None, *, kernel_backend: str = "",
              min_segment_ops: int = 4, min_segment_flops: float = 0.0) -> list[Segment]:
    """Ordered segments of ``model``'s main graph.

    ``backends``: (name, supports) in order of preference. ``kernel_ops``: (domain, op_type)
    of custom ops that have a kernel of their own; each such node becomes a segment of its own
    on ``kernel_backend``.
    """
    if kernel_ops and not kernel_backend:
        raise ValueError("kernel_ops need the kernel_backend that runs them")
    graph = model.graph
    graph.sort()
    constants = set(graph.initializers) | {v.name for n in graph if _is_constant(n) for v in n.outputs}
    nodes = [n for n in graph if not _is_constant(n)]
    if not nodes:
        raise BuildError("the model has no nodes to partition")
    chosen, able = _assign(nodes, backends, dict(kernel_ops or {}), kernel_backend)
    runs = _schedule(nodes, chosen, kernel_backend)
    merged = _merge_tiny(runs, chosen, able, min_segment_ops, min_segment_flops, kernel_backend)
    segments = [Segment(backend, run, flops=sum(estimate_flops(n) for n in run)) for backend, run in merged]
    _borders(segments, graph, constants)
    return segments


def handoffs(segments: Sequence[Segment], graph_inputs: Sequence[str], graph_outputs: Sequence[str]) -> list[HandOff]:
    """Every edge of the segment graph: graph input -> segment, segment -> segment, segment -> graph output."""
    producer = {name: i for i, s in enumerate(segments) for name in s.outputs}
    edges = []
    for i, segment in enumerate(segments):
        for name in segment.inputs:
            edges.append(HandOff(name, producer.get(name) if name not in graph_inputs else None, i))
    for name in graph_outputs:
        edges.append(HandOff(name, producer.get(name), None))
    return edges


# -- a segment as a standalone model -------------------------------------------------------------
def _value_info(value: ir.Value) -> onnx.ValueInfoProto:
    dims = None
    if value.shape is not None:
        dims = [d if isinstance(d, int) else (str(d.value) if getattr(d, "value", None) else None) for d in value.shape]
    elem = value.dtype.value if value.dtype is not None else onnx.TensorProto.UNDEFINED
    return onnx.helper.make_tensor_value_info(value.name, elem, dims)


def segment_model(model: ir.Model, segment: Segment) -> ir.Model:
    """``segment`` as a model of its own: its nodes, the constants they read, its borders as I/O."""
    graph = model.graph
    values = {v.name: v for n in graph for v in (*n.inputs, *n.outputs) if v is not None}
    values.update({v.name: v for v in graph.inputs})
    read = {v.name for n in segment.nodes for v in n.inputs if v is not None}
    constant_nodes = [n for n in graph if _is_constant(n) and n.outputs[0].name in read]
    nodes = [ir.serde.serialize_node(n) for n in (*constant_nodes, *segment.nodes)]
    initializers = [ir.serde.serialize_tensor(v.const_value) for name, v in graph.initializers.items()
                    if name in read and v.const_value is not None]
    for tensor, name in zip(initializers, [n for n in graph.initializers if n in read]):
        tensor.name = name
    proto_graph = onnx.helper.make_graph(nodes, f"{graph.name or 'graph'}_segment",
                                         [_value_info(values[n]) for n in segment.inputs],
                                         [_value_info(values[n]) for n in segment.outputs], initializers)
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    proto = onnx.helper.make_model(proto_graph, opset_imports=opsets, ir_version=model.ir_version)
    return ir.serde.deserialize_model(proto)
