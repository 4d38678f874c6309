"""Route (a): the captured program -> ONNX with torch's dynamo exporter -> the core's ONNX import.

Handing the exported file to the core's ONNX frontend means a PyTorch source reaches the
optimise stage exactly as an ONNX source would: constants lifted, input shapes pinned.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import warnings
from pathlib import Path

from edgebuild.plugin import BuildError
from edgebuild_pytorch.weight_pages import drop_resident_pages


def export_onnx(program, path: Path, *, opset: int, input_names: list[str], output_names: list[str]) -> None:
    """Write ``program`` as ONNX at ``path`` (weights in ``<path>.data``), graph I/O named as the recipe says."""
    model = export_model(program, opset=opset, input_names=input_names, output_names=output_names)
    save_model(model, path)


def export_model(program, *, opset: int, input_names: list[str], output_names: list[str]):
    """``program`` as an ``onnx_ir`` model, graph I/O named ``input_names`` / ``output_names``."""
    import torch

    # The exporter prints progress on stdout, which `run --json` reserves for its result.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(program, dynamo=True, opset_version=opset, optimize=False, verbose=False)
        # Its optimiser would fold every Transpose of a weight (nn.Linear's x @ W.T) into a new
        # initializer at once: a second copy of all the weights. Those become lazy initializers
        # first, each transposed only when the save writes it.
        lazy_weight_transposes(onnx_program.model.graph)
        onnx_program.optimize()
    model = onnx_program.model
    graph = model.graph
    if len(graph.inputs) != len(input_names) or len(graph.outputs) != len(output_names):
        raise BuildError(
            f"the exported ONNX graph has {len(graph.inputs)} input(s) and {len(graph.outputs)} output(s), "
            f"expected {len(input_names)} and {len(output_names)}",
            hint="an input the model ignores is dropped by the exporter: remove it from source.inputs",
        )
    _rename(graph, list(graph.inputs) + list(graph.outputs), input_names + output_names)
    return model


def save_model(model, path: Path) -> None:
    """Write ``model`` at ``path`` (weights in ``<path>.data``), then drop the resident pages of the
    module's memory-mapped weights it was written from: the file holds them now."""
    import onnx_ir as ir

    path.parent.mkdir(parents=True, exist_ok=True)
    ir.save(model, path, external_data=path.name + ".data")
    drop_written_pages(model)


def drop_written_pages(model) -> None:
    """Drop the resident pages of the module's memory-mapped weights ``model`` holds, once written."""
    drop_resident_pages(_torch_tensors(model.graph))


def _torch_tensors(graph) -> list:
    """The torch tensors behind ``graph``'s initializers (the module's own, memory-mapped ones)."""
    import torch

    found = []
    for value in graph.initializers.values():
        raw = getattr(value.const_value, "raw", None)
        if isinstance(raw, torch.Tensor):
            found.append(raw)
    return found


def lazy_weight_transposes(graph, min_elements: int = 1024) -> int:
    """Replace each 2-D ``Transpose`` of an initializer by an initializer computed when it is
    written (and the source's mapped pages dropped then); returns how many were."""
    import onnx_ir as ir

    count = 0
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 1:
            continue
        source, output = node.inputs[0], node.outputs[0]
        tensor = source.const_value if source is not None and graph.initializers.get(source.name) is source else None
        perm = node.attributes.get("perm")
        if (tensor is None or len(tensor.shape) != 2 or tensor.size < min_elements or output.is_graph_output()
                or (perm is not None and list(perm.as_ints()) != [1, 0])):
            continue
        weight = transposed_when_written(tensor, f"{output.name}__weight", source.name)
        graph.register_initializer(weight)
        ir.convenience.replace_all_uses_with(output, weight)
        graph.remove(node, safe=True)
        if not source.uses() and not source.is_graph_output() and not source.is_graph_input():
            graph.initializers.pop(source.name)
        count += 1
    return count


def transposed_when_written(tensor, name: str, source_name: str):
    """An initializer value named ``name`` holding the 2-D ``tensor`` transposed, computed only when it
    is written; ``meta["source_weight"]`` is ``source_name``, the initializer it stands for, and
    ``meta["transposed_from"]`` ``tensor``."""
    import numpy as np
    import onnx_ir as ir
    import torch

    def transposed():
        raw = getattr(tensor, "raw", None)
        if isinstance(raw, torch.Tensor):
            # torch's blocked copy transposes several times faster than numpy's strided one
            array = raw.detach().t().contiguous().numpy()
            drop_resident_pages([raw])
        else:
            array = np.ascontiguousarray(tensor.numpy().T)
        return ir.Tensor(array, name=name)

    rows, cols = tensor.shape
    lazy = ir.LazyTensor(transposed, dtype=tensor.dtype, shape=ir.Shape([cols, rows]), name=name)
    weight = ir.Value(name=name, shape=ir.Shape([cols, rows]), type=ir.TensorType(tensor.dtype), const_value=lazy)
    weight.meta["source_weight"] = source_name
    weight.meta["transposed_from"] = tensor  # edgebuild_pytorch.file_weights may read it in place
    return weight


def _rename(graph, values, names: list[str]) -> None:
    """Give graph inputs/outputs their public names, moving aside any inner value already so named."""
    import onnx_ir as ir

    wanted = set(names)
    public = {id(v) for v in values}
    inner = [v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs]
    for value in inner:
        if value.name in wanted and id(value) not in public:
            value.name = f"{value.name}__inner"
    for value, name in zip(values, names):
        value.name = name


def import_through_onnx(program, out_dir: Path, *, opset: int, input_specs: dict[str, dict],
                        output_names: list[str]) -> dict:
    from edgebuild.plugin.graph import OnnxFrontend

    staging = out_dir / "exported"
    try:
        export_onnx(program, staging / "model.onnx", opset=opset, input_names=list(input_specs),
                    output_names=output_names)
        report = OnnxFrontend().import_model(staging / "model.onnx", input_specs, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report
