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

from edgebuild.errors import BuildError


def export_onnx(program, path: Path, *, opset: int, input_names: list[str], output_names: list[str]) -> None:
    """Write ``program`` as ONNX at ``path`` (weights in ``<path>.data``), graph I/O named as the recipe says."""
    import onnx_ir as ir

    model = export_model(program, opset=opset, input_names=input_names, output_names=output_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    ir.save(model, path, external_data=path.name + ".data")


def export_model(program, *, opset: int, input_names: list[str], output_names: list[str]):
    """``program`` as an ``onnx_ir`` model, graph I/O named ``input_names`` / ``output_names``."""
    import torch

    # The exporter prints progress on stdout, which `run --json` reserves for its result.
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(program, dynamo=True, opset_version=opset, optimize=True, verbose=False)
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
    from edgebuild.graph.frontend import OnnxFrontend

    staging = out_dir / "exported"
    try:
        export_onnx(program, staging / "model.onnx", opset=opset, input_names=list(input_specs),
                    output_names=output_names)
        report = OnnxFrontend().import_model(staging / "model.onnx", input_specs, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report
