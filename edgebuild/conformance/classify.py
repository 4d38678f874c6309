"""Setting aside the cases a backend cannot run: types it cannot hold, ops it has no lowering for."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from edgebuild.conformance.cases import Case, qualified_op

# Tensor element types a Core ML-class backend can hold (narrow integers, 4 to 16 bits, and
# float64 travel as int32 / float32; a 4-bit constant weight stays 4-bit). Everything else is
# classified unsupported before the backend runs.
REPRESENTABLE_TYPES = {"FLOAT", "FLOAT16", "DOUBLE", "INT4", "UINT4", "INT8", "UINT8", "INT16", "UINT16", "INT32",
                       "INT64", "BOOL"}
# Ops that are data, not compute: every backend receives them as constants.
STRUCTURAL_OPS = {("", "Constant")}
_INT32 = np.iinfo(np.int32)


def _type_problem(type_proto) -> str | None:
    """Why a value of this ONNX type cannot reach the backend, or None."""
    import onnx

    kind = type_proto.WhichOneof("value")
    if kind in ("sequence_type", "optional_type", "map_type"):
        return f"{kind.removesuffix('_type')} values"
    if kind == "sparse_tensor_type":
        return "sparse tensors"
    if kind == "tensor_type":
        name = onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type)
        if name not in REPRESENTABLE_TYPES:
            return f"{name.lower()} tensors"
    return None


def _graph_type_problem(graph) -> str | None:
    for value in list(graph.input) + list(graph.output):
        problem = _type_problem(value.type)
        if problem:
            return problem
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                problem = _graph_type_problem(sub)
                if problem:
                    return problem
    return None


def _value_problem(arrays: Sequence) -> str | None:
    for array in arrays:
        if not isinstance(array, np.ndarray):
            return "sequence values"
        if array.dtype == object:
            return "string tensors"
        if array.size == 0:
            return "empty (zero-size) tensors"
        if array.dtype.kind in "iu" and array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
            return "integers beyond int32 range"
    return None


def _iter_nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _iter_nodes(sub)


def missing_lowerings(model, registry, backend: str) -> list[str]:
    """Ops of ``model`` (including subgraphs) the backend has no lowering for at its opset."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    missing = []
    for node in _iter_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in STRUCTURAL_OPS:
            continue
        if registry.lowering(backend, node.op_type, domain, opsets.get(domain, 1)) is None:
            op = qualified_op(domain, node.op_type)
            if op not in missing:
                missing.append(op)
    return missing


def classify(case: Case, registry, backend: str) -> str | None:
    """The reason ``case`` cannot run on ``backend`` (types, missing lowerings), or None."""
    import onnx

    model = onnx.load_from_string(case.model)
    problem = _graph_type_problem(model.graph) or _value_problem(case.inputs) or _value_problem(case.outputs)
    if problem:
        return problem
    missing = missing_lowerings(model, registry, backend)
    if missing:
        return "no lowering: " + ", ".join(missing)
    return None
