"""Exported weights that point into the checkpoint instead of being written again.

A checkpoint read from safetensors (or ``torch.load(mmap=True)``) is mapped: every parameter is a
view of the file's own bytes. The exporter's graph holds those tensors to be written out, and
``nn.Linear``'s ``x @ W.T`` as a transposed copy of each weight (onnx_route's lazy transposes), so
writing the graph reads, transposes and writes every weight byte once more.

Here each initializer whose bytes are an unchanged range of the checkpoint becomes an external
tensor at that range, and a lazily transposed one a ``Transpose`` node over such a tensor. The
import stage's entry then refers to the checkpoint (a large one; a small one is copied whole in
the kernel: ``edgebuild.store.links.refer``, ``save_reusing_data``), and a
backend reads ``W`` through the Transpose: Core ML's ``linear`` wants exactly ``W``'s [out, in].
"""

from __future__ import annotations

from pathlib import Path

from edgebuild.plugin.pages import file_offsets
from edgebuild.plugin import unique_name


def reference_file_weights(graph, checkpoint: Path) -> int:
    """Point ``graph``'s initializers that are unchanged ranges of ``checkpoint`` into it, in place;
    returns how many now do. Nothing changes when the file is not mapped, or a page of a mapping
    of it was written."""
    import onnx_ir as ir

    mappings = file_offsets(checkpoint)
    if not mappings:
        return 0
    references: dict[tuple, ir.Value] = {}  # one value per range: tied weights stay one tensor
    transposes = []
    taken = set(graph.initializers) | {v.name for node in graph for v in node.outputs}
    for value in list(graph.initializers.values()):
        if value.is_graph_input() or value.const_value is None:
            continue
        source = value.meta.get("transposed_from")
        tensor = source if source is not None else value.const_value
        location = _file_range(getattr(tensor, "raw", None), mappings)
        if location is None:
            continue
        key = (*location, tensor.dtype, tuple(tensor.shape))
        if source is None:
            if key in references:
                ir.convenience.replace_all_uses_with(value, references[key])
                graph.initializers.pop(value.name)
            else:
                value.const_value = _external(tensor, location, checkpoint, value.name)
                references[key] = value
            continue
        weight = references.get(key)
        if weight is None:
            name = unique_name(value.meta.get("source_weight") or f"{value.name}__source", taken, separator="__",
                               first=1)
            weight = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                              const_value=_external(tensor, location, checkpoint, name))
            graph.register_initializer(weight)
            references[key] = weight
        transposes.append((value, weight))
    first = next(iter(graph), None)
    nodes = [_transposed(graph, value, weight) for value, weight in transposes]
    if first is not None and nodes:
        graph.insert_before(first, nodes)  # before every reader
    else:
        graph.extend(nodes)  # (a graph of initializers only: read by its outputs)
    return len(references) + len(transposes)


def _transposed(graph, value, weight):
    """A Transpose of ``weight`` taking the place of the initializer ``value`` (its name, its readers)."""
    import onnx_ir as ir

    node = ir.node("Transpose", [weight], attributes={"perm": [1, 0]}, name=f"{value.name}__read")
    graph.initializers.pop(value.name)
    ir.convenience.replace_all_uses_with(value, node.outputs[0])
    output = node.outputs[0]
    output.name, output.shape, output.type = value.name, value.shape, value.type
    return node


def _file_range(raw, mappings: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """(file offset, bytes) of the torch tensor ``raw`` when it is a contiguous view of a mapping."""
    import torch

    if not isinstance(raw, torch.Tensor) or raw.device.type != "cpu" or not raw.is_contiguous():
        return None
    address, size = raw.data_ptr(), raw.numel() * raw.element_size()
    for start, end, offset in mappings:
        if start <= address and address + size <= end:
            return offset + address - start, size
    return None


def _external(tensor, location: tuple[int, int], checkpoint: Path, name: str):
    import onnx_ir as ir

    offset, size = location
    return ir.ExternalTensor(checkpoint.name, offset, size, tensor.dtype, shape=ir.Shape(tensor.shape),
                             name=name, base_dir=checkpoint.parent)
