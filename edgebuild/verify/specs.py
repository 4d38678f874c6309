"""The shape and dtype each graph input is validated at."""

from __future__ import annotations

from pathlib import Path

from edgebuild.recipe.shapes import per_dim


def onnx_input_specs(model_path: Path, recipe_inputs: dict) -> dict[str, dict]:
    """Shape and dtype of every graph input: the recipe's where given, else the model's static dims."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    specs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        given = recipe_inputs.get(value.name) or {}
        shape = per_dim(given.get("shape")) or dims
        resolved = []
        for i, dim in enumerate(shape):
            if isinstance(dim, dict):  # enumerated / range: validate at the first / default size
                dim = dim.get("default") or (dim.get("enumerated") or [None])[0] or (dim.get("range") or [None])[0]
            if not isinstance(dim, int):
                dim = dims[i] if i < len(dims) and dims[i] else 1
            resolved.append(int(dim))
        specs[value.name] = {"shape": resolved, "dtype": given.get("dtype", dtype) if given else dtype}
        if given.get("value") is not None:
            specs[value.name]["value"] = given["value"]
    return specs
