"""Lower one partition segment into its directory, returning its manifest entry (files, I/O).

``coreml``: the Core ML lowering + ``save_mlpackage``; ``mpsgraph``: this plugin's lowering;
``msl``: the op plugin's kernel source, its declaration (``kernel.json``) and the node's
constant inputs (``constants.bin``), so the segment runs without the ONNX model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import BuildError
from edgebuild.plugin.bundle import SegmentSpec, TensorSpec
from edgebuild.plugin.graph import Segment, segment_model
from edgebuild_mpsgraph.runtime import KERNEL_CONSTANTS_FILE, KERNEL_SOURCE_FILE, KERNEL_SPEC_FILE

ALIGNMENT = 64


def value_dtype(value: ir.Value) -> str:
    if value.dtype is None:
        raise BuildError(f"value {value.name!r} has no known dtype at a segment border")
    return np.dtype(value.dtype.numpy()).name


def value_shape(value: ir.Value) -> list[int]:
    if value.shape is None or any(not isinstance(d, int) for d in value.shape):
        raise BuildError(f"value {value.name!r} crosses a segment border with a non-static shape {value.shape}",
                         hint="pin every input dimension in the recipe's source.inputs; bundles use static shapes")
    return list(value.shape)


def tensor_spec(value: ir.Value, *, binding: str | None = None, dtype: str | None = None) -> TensorSpec:
    return TensorSpec(name=value.name, dtype=dtype or value_dtype(value), shape=value_shape(value),
                      binding=binding if binding and binding != value.name else None)


def _values(model: ir.Model) -> dict[str, ir.Value]:
    found = {v.name: v for n in model.graph for v in (*n.inputs, *n.outputs) if v is not None}
    found.update({v.name: v for v in model.graph.inputs})
    return found


def lower_coreml(model: ir.Model, segment: Segment, directory: Path, *, params: dict, registry) -> dict:
    """The Core ML backend lowers the segment (found through the registry: plugins do not import each other)."""
    backend = registry.get("backends", "coreml")
    if backend is None:
        raise BuildError("a bundle with Core ML segments needs the Core ML backend",
                         hint="pip install edgebuild-coreml, then check `edgebuild plugins`")
    lowered = backend.lower_segment(segment_model(model, segment), directory, params=params, registry=registry)
    values, crossing = _values(model), lowered["boundary_dtypes"]

    def spec(name, names):
        dtype = value_dtype(values[name])
        return tensor_spec(values[name], binding=names[name], dtype=crossing.get(dtype, dtype))

    return {"files": lowered["files"], "compute_units": lowered["compute_units"],
            "inputs": [spec(n, lowered["input_names"]) for n in segment.inputs],
            "outputs": [spec(n, lowered["output_names"]) for n in segment.outputs]}


def lower_mpsgraph(model: ir.Model, segment: Segment, directory: Path, *, params: dict, registry) -> dict:
    from edgebuild_mpsgraph.lowering import lower_model
    from edgebuild_mpsgraph.program import PROGRAM_FILE, WEIGHTS_FILE, save_program

    program = lower_model(segment_model(model, segment), registry)
    save_program(program, directory)

    def spec(name):
        dtype, shape = program.tensors[name]
        return TensorSpec(name=name, dtype=dtype, shape=list(shape))

    return {"files": {"program": PROGRAM_FILE, "weights": WEIGHTS_FILE}, "compute_units": "GPU",
            "inputs": [spec(n) for n in segment.inputs], "outputs": [spec(n) for n in segment.outputs]}


def lower_msl(model: ir.Model, segment: Segment, directory: Path, *, params: dict, registry) -> dict:
    (node,) = segment.nodes  # a kernel segment is one custom op
    spec = registry.get("custom_ops", (node.domain, node.op_type))
    attributes = {name: attr.value for name, attr in node.attributes.items()}
    unknown = set(attributes) - set(spec.attributes)
    if unknown:
        raise BuildError(f"node {node.name!r} ({spec.qualified_name}): attribute(s) {', '.join(sorted(unknown))} "
                         "are not declared by its kernel")
    inputs, blob = [], bytearray()
    for decl, value in zip(spec.inputs, node.inputs):
        if value.const_value is not None:  # an initializer: shipped with the segment
            array = np.ascontiguousarray(value.const_value.numpy().astype(decl.numpy_dtype))
            blob.extend(b"\0" * (-len(blob) % ALIGNMENT))
            inputs.append({"decl": decl.name, "buffer": spec.buffers[decl.name], "constant": {"dtype": array.dtype.name, "shape": list(array.shape),
                                                           "offset": len(blob), "nbytes": array.nbytes}})
            blob.extend(array.tobytes())
        else:
            inputs.append({"decl": decl.name, "tensor": value.name, "buffer": spec.buffers[decl.name]})
    outputs = [{"decl": decl.name, "tensor": value.name, "buffer": spec.buffers[decl.name]}
               for decl, value in zip(spec.outputs, node.outputs)]
    values = _values(model)
    shapes = {i["decl"]: (tuple(i["constant"]["shape"]) if "constant" in i else tuple(value_shape(values[i["tensor"]])))
              for i in inputs}
    attrs = spec.attrs_with_defaults(attributes)
    grid, group = spec.dispatch_size(shapes, attrs)
    constants = [{"name": c.name, "buffer": c.index, "dtype": c.dtype, "value": c.evaluate(shapes, attrs).item()}
                 for c in spec.constants]
    record = {"domain": spec.domain, "op_type": spec.op_type, "entry": spec.entry, "attributes": attributes,
              "inputs": inputs, "outputs": outputs, "constants": constants,
              "threads_per_grid": list(grid), "threads_per_threadgroup": list(group)}
    (directory / KERNEL_SOURCE_FILE).write_text(spec.source_text())
    (directory / KERNEL_SPEC_FILE).write_text(json.dumps(record, indent=1))
    (directory / KERNEL_CONSTANTS_FILE).write_bytes(bytes(blob))
    return {"files": {"source": KERNEL_SOURCE_FILE, "spec": KERNEL_SPEC_FILE, "constants": KERNEL_CONSTANTS_FILE},
            "compute_units": "GPU",
            "inputs": [tensor_spec(values[n]) for n in segment.inputs],
            "outputs": [tensor_spec(values[n]) for n in segment.outputs]}


KERNEL_BACKEND = "msl"  # the segments holding one custom op's Metal kernel
LOWER_SEGMENT = {"coreml": lower_coreml, "mpsgraph": lower_mpsgraph, KERNEL_BACKEND: lower_msl}


def lower_segment(model: ir.Model, segment: Segment, index: int, root: Path, *, params: dict, registry) -> SegmentSpec:
    relative = f"segments/{index}_{segment.backend}"
    directory = Path(root) / relative
    directory.mkdir(parents=True, exist_ok=True)
    entry = LOWER_SEGMENT[segment.backend](model, segment, directory, params=params, registry=registry)
    entry["files"] = {role: f"{relative}/{name}" for role, name in entry["files"].items()}
    return SegmentSpec(index=index, backend=segment.backend, path=relative, ops=segment.op_types(), **entry)
