"""A bundle's Core ML segment: a partition of the model lowered to its own ``.mlpackage``.

Other backends (the MPSGraph bundle) reach this through the registry
(``Backend.lower_segment``), never by importing the plugin.
"""

from __future__ import annotations

from pathlib import Path

ARTIFACT = "model.mlpackage"
# Core ML has no int64 or bool tensors at its boundary: they cross as int32
BOUNDARY_DTYPES = {"int64": "int32", "bool": "int32", "int16": "int32", "int8": "int32", "uint8": "int32"}


def lower_segment(model, directory: Path, *, params: dict, registry) -> dict:
    """Lower the ONNX sub-model ``model`` into ``directory/model.mlpackage``."""
    from edgebuild_coreml.compute import compute_units_for
    from edgebuild_coreml.lowering.converter import convert
    from edgebuild_coreml.lowering.package import save_mlpackage

    result = convert(model, target=params["deployment_target"], precision=params["precision"], registry=registry)
    units = compute_units_for(params["policy"])
    save_mlpackage(result, Path(directory) / ARTIFACT, target=params["deployment_target"],
                   precision=params["precision"], metadata={}, compute_units=units)
    return {"files": {"model": ARTIFACT}, "compute_units": units.name, "input_names": dict(result.input_names),
            "output_names": dict(result.output_names), "boundary_dtypes": BOUNDARY_DTYPES}
