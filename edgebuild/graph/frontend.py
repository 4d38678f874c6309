"""The ONNX frontend: brings a source ``.onnx`` into the build as a clean, pinned IR model.

Import does only what later stages need to be able to trust the model: external data that
stays inside the model's directory, constants as initializers, fixed inputs folded in, the
recipe's static dims pinned and an opset new enough for the passes. Weights are never
copied into memory: embedded weights are read as external data pointing into the ``.onnx`` file
itself, and onnx_ir keeps external tensors memory-mapped until the save writes them to
``model.onnx.data``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnx import version_converter

from edgebuild.errors import BuildError
from edgebuild.graph.external_data import check_external_data, iter_graphs, iter_tensors
from edgebuild.graph.onnx_stream import load_streamed
from edgebuild.graph.weight_files import save_reusing_data
from edgebuild.protocols import Frontend
from edgebuild.recipe.shapes import per_dim

MIN_OPSET = 13
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


def onnx_opset(model: ir.Model) -> int:
    """The model's ai.onnx opset version (both spellings of the default domain count)."""
    imports = model.opset_imports
    return int(imports.get("", imports.get("ai.onnx", 1)))


def dtype_from_name(name: str, where: str) -> ir.DataType:
    try:
        return ir.DataType.from_numpy(np.dtype(name))
    except TypeError as exc:
        raise BuildError(f"{where}: unknown dtype {name!r}", hint="use a numpy dtype name such as float32") from exc


def describe_value(value: ir.Value) -> dict:
    """A JSON-ready {"shape", "dtype"} of a graph input or output; symbolic dims as names."""
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else (d.value if d.value is not None else "?") for d in value.shape]
    dtype = None
    if value.dtype is not None:  # recipe spelling (numpy's), e.g. float32, int64
        try:
            dtype = np.dtype(value.dtype.numpy()).name
        except TypeError:
            dtype = value.dtype.name.lower()
    return {"shape": shape, "dtype": dtype}


class OnnxFrontend(Frontend):
    """Imports ``.onnx`` files; registered by the core as the ``onnx`` frontend."""

    def import_model(self, path: Path, inputs: dict[str, dict], out_dir: Path, *, options: dict | None = None,
                     base_dir: Path | None = None) -> dict:
        path = Path(path)
        return self.import_ir(load_checked(path), path, inputs, out_dir)

    def source_files(self, path: Path) -> list[Path]:
        from edgebuild.graph.source_files import external_data_files

        return external_data_files(path)

    def import_ir(self, model: ir.Model, path: Path, inputs: dict[str, dict], out_dir: Path, *,
                  data_copied_from: Path | None = None) -> dict:
        """``import_model`` of a model already in memory (``path``: where it is from, for messages;
        a frontend that exports ONNX hands its model over here instead of writing it twice).
        ``data_copied_from``: ``out_dir / DATA_FILE`` is a vouched copy of that file, made while
        the frontend exported (``weight_files.copying``), or a reference to it (``links.refer``);
        kept if the model's weights point into it, else removed."""
        out_dir = Path(out_dir)
        notes: list[str] = []
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".opset-upgrade.", dir=out_dir) as scratch:
            model = upgrade_opset(model, path, notes, scratch_dir=Path(scratch))
            lift_constants(model)
            inputs = inputs or {}
            check_unnamed_inputs(model, path)
            check_input_names(model, inputs, path)
            for name, spec in inputs.items():
                value = next(v for v in model.graph.inputs if v.name == name)
                if "value" in spec and spec["value"] is not None:
                    fold_fixed_input(model, value, spec, notes)
                else:
                    pin_input(value, spec)
            source_data = _single_data_file(model)
            copied = data_copied_from is not None and source_data is not None and _same_path(source_data,
                                                                                          data_copied_from)
            if not source_data or not save_reusing_data(model, out_dir / MODEL_FILE, DATA_FILE, source_data,
                                                        copied=copied):
                if data_copied_from is not None:
                    (out_dir / DATA_FILE).unlink(missing_ok=True)
                ir.save(model, out_dir / MODEL_FILE, external_data=DATA_FILE)
        report = import_report(model, notes)
        # Unmap the weights now rather than whenever the cyclic graph (nodes <-> values) is
        # collected: what stays for the collector is the graph and its small tensors, not worth
        # a full collection over every library loaded in the process.
        unmap_weights(model)
        return report


def _single_data_file(model: ir.Model) -> Path | None:
    """The one file every external tensor of ``model`` is read from, if there is one."""
    paths = {Path(t.path) for t in iter_tensors(model) if isinstance(t, ir.ExternalTensor)}
    path = paths.pop() if len(paths) == 1 else None
    return path if path is not None and path.suffix != ".onnx" else None  # not weights inside a proto


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def unmap_weights(model: ir.Model) -> None:
    """Close the memory maps of ``model``'s external tensors (they reload if read again)."""
    for tensor in iter_tensors(model):
        if isinstance(tensor, ir.ExternalTensor):
            try:
                tensor.release()
            except BufferError:  # an array still viewing the mapping keeps it open
                pass


def load_checked(path: Path) -> ir.Model:
    """Load ``path`` with onnx_ir (weights stay lazy) and check its external data.

    A binary ``.onnx`` file is read by :mod:`edgebuild.graph.onnx_stream`: its embedded weights
    become external data mapped from the file, so they are never in memory twice.
    """
    if not path.is_file():
        raise BuildError(f"{path}: no such ONNX file")
    try:
        model = load_streamed(path) if path.suffix == ".onnx" else ir.load(path)
    except Exception as exc:
        raise BuildError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    check_external_data(model, path.parent)
    return model


def upgrade_opset(model: ir.Model, path: Path, notes: list[str], scratch_dir: Path | None = None) -> ir.Model:
    """Convert models older than opset 13 with onnx's converter; keep the original if it fails.

    The converter works on serialized protos, so weights embedded in the model would be copied
    several times over. With ``scratch_dir`` the weights are first written there as external
    data and the converter sees references only; the upgraded model maps them from that file,
    which must outlive the model's save.
    """
    opset = onnx_opset(model)
    if opset >= MIN_OPSET:
        return model
    try:
        proto = _weightless_proto(model, scratch_dir) if scratch_dir else ir.serde.serialize_model(model)
        converted = version_converter.convert_version(proto, MIN_OPSET)
        del proto
        upgraded = ir.serde.deserialize_model(converted)
    except Exception as exc:  # the converter lacks adapters for some ops
        notes.append(f"opset {opset} kept: conversion to {MIN_OPSET} failed ({type(exc).__name__}: {exc})")
        return model
    ir.external_data.set_base_dir(upgraded.graph, scratch_dir or path.parent)
    notes.append(f"opset upgraded from {opset} to {MIN_OPSET}")
    return upgraded


def _weightless_proto(model: ir.Model, scratch_dir: Path):
    """``model`` as a proto whose initializers reference external data in ``scratch_dir``."""
    _load_attribute_tensors(model)
    scratch = scratch_dir / MODEL_FILE
    ir.save(model, scratch, external_data=DATA_FILE)
    return onnx.load(str(scratch), load_external_data=False)


def _load_attribute_tensors(model: ir.Model) -> None:
    """Bring mapped ``Constant`` values into memory: the save externalizes initializers only, so a
    node attribute would keep pointing at its file by a path relative to the wrong directory."""
    for graph in iter_graphs(model.graph):
        for node in graph:
            for name, attr in list(node.attributes.items()):
                tensor = None if attr.is_ref() or attr.type != ir.AttributeType.TENSOR else attr.value
                if isinstance(tensor, ir.ExternalTensor):
                    loaded = ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)
                    node.attributes[name] = ir.AttrTensor(name, loaded)
                    tensor.release()


def lift_constants(model: ir.Model) -> None:
    """Turn every ``Constant`` node into an initializer so passes see one kind of constant."""
    common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)


def check_unnamed_inputs(model: ir.Model, path: Path) -> None:
    """An input with an empty name is a usage error (exit 2): the model must be fixed, not rebuilt."""
    from edgebuild.errors import UsageError
    from edgebuild.recipe.input_names import first_unnamed, unnamed_input_message

    names = [v.name for v in model.graph.inputs]
    unnamed = first_unnamed(names)
    if unnamed is not None:
        message, hint = unnamed_input_message(path, unnamed, len(names))
        raise UsageError(message, hint=hint)


def check_input_names(model: ir.Model, inputs: dict[str, dict], path: Path) -> None:
    known = [v.name for v in model.graph.inputs]
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise BuildError(
            f"{path.name}: the recipe names input(s) {', '.join(map(repr, unknown))}, "
            f"which the model does not have",
            hint=f"the model's inputs are: {', '.join(known) or '(none)'}",
        )


def pin_input(value: ir.Value, spec: dict) -> None:
    """Give ``value`` the recipe's shape: ints become static, flexible dims stay symbolic."""
    where = f"input {value.name!r}"
    if spec.get("dtype"):
        wanted = dtype_from_name(spec["dtype"], where)
        if value.dtype is not None and value.dtype != wanted:
            raise BuildError(
                f"{where}: the recipe says dtype {spec['dtype']}, the model takes "
                f"{value.dtype.name.lower()}",
                hint="fix the recipe's dtype for this input",
            )
        value.dtype = wanted
    dims = per_dim(spec.get("shape"))
    if dims is None:
        return
    old = list(value.shape) if value.shape is not None else [None] * len(dims)
    if len(old) != len(dims):
        raise BuildError(
            f"{where}: the recipe gives {len(dims)} dims {dims}, the model's input has rank {len(old)}",
            hint="give one entry per dimension",
        )
    new: list[int | str | None] = []
    for axis, (model_dim, recipe_dim) in enumerate(zip(old, dims)):
        new.append(pinned_dim(value.name, axis, model_dim, recipe_dim))
    value.shape = ir.Shape(new)


def pinned_dim(input_name: str, axis: int, model_dim, recipe_dim) -> int | str | None:
    """One dim after pinning: the recipe's int, or a symbolic name for a flexible dim."""
    where = f"input {input_name!r}"
    # some exporters (Paddle) write -1 for a dynamic dim
    model_static = model_dim if isinstance(model_dim, int) and model_dim >= 0 else None
    if isinstance(recipe_dim, bool) or recipe_dim is None:
        raise BuildError(f"{where}: dim {axis} is {recipe_dim!r}, expected an int, a name or a range")
    if isinstance(recipe_dim, int):
        if model_static is not None and model_static != recipe_dim:
            raise BuildError(
                f"{where}: dim {axis} is fixed to {model_static} in the model, the recipe asks for {recipe_dim}",
                hint=f"use {model_static}, or re-export the model with a dynamic axis",
            )
        return recipe_dim
    if model_static is not None:
        raise BuildError(
            f"{where}: dim {axis} is fixed to {model_static} in the model and cannot be flexible "
            f"({recipe_dim!r})",
            hint=f"use {model_static}, or re-export the model with a dynamic axis",
        )
    if isinstance(recipe_dim, str):
        return recipe_dim
    # enumerated / range dims keep the model's symbol (or get one) so the backend sees them
    model_name = getattr(model_dim, "value", None)
    return model_name if isinstance(model_name, str) else f"{input_name}_dim{axis}"


def fold_fixed_input(model: ir.Model, value: ir.Value, spec: dict, notes: list[str]) -> None:
    """Replace a graph input by an initializer holding the recipe's value."""
    where = f"input {value.name!r}"
    if spec.get("dtype"):
        dtype = dtype_from_name(spec["dtype"], where)
    elif value.dtype is not None:
        dtype = value.dtype
    else:
        raise BuildError(f"{where}: fixed value given but neither the recipe nor the model says its dtype")
    array = np.asarray(spec["value"], dtype=dtype.numpy())
    if spec.get("shape") is not None:
        try:
            array = array.reshape([int(d) for d in spec["shape"]])
        except (TypeError, ValueError) as exc:
            raise BuildError(
                f"{where}: the fixed value does not fit the shape {spec['shape']}",
                hint="give a static shape matching the value, or drop the shape",
            ) from exc
    if value.shape is not None and len(value.shape) != array.ndim:
        raise BuildError(
            f"{where}: the fixed value has rank {array.ndim}, the model's input has rank {len(value.shape)}",
        )
    model.graph.inputs.remove(value)
    value.const_value = ir.tensor(array, name=value.name)
    value.dtype = dtype
    value.shape = ir.Shape(array.shape)
    model.graph.register_initializer(value)
    notes.append(f"input {value.name!r} fixed to a {dtype.name.lower()} constant of shape {list(array.shape)}")


def import_report(model: ir.Model, notes: list[str]) -> dict:
    graphs = list(iter_graphs(model.graph))
    initializers = [v for g in graphs for v in g.initializers.values() if v.const_value is not None]
    return {
        "opset": onnx_opset(model),
        "nodes": sum(len(g) for g in graphs),
        "initializers": len(initializers),
        "weight_bytes": int(sum(v.const_value.nbytes for v in initializers)),
        "weight_dtypes": weight_dtypes(initializers),  # the report compares compressed sizes with these
        "inputs": {v.name: describe_value(v) for v in model.graph.inputs},
        "outputs": {v.name: describe_value(v) for v in model.graph.outputs},
        "notes": notes,
    }


def weight_dtypes(initializers) -> dict[str, int]:
    """Bytes of the weights per element type (``{"float32": 6750388}``), largest first."""
    totals: dict[str, int] = {}
    for value in initializers:
        dtype = value.const_value.dtype
        try:
            name = dtype.numpy().name  # float32, not onnx's FLOAT
        except TypeError:  # a type numpy has no name for
            name = dtype.name.lower()
        totals[name] = totals.get(name, 0) + int(value.const_value.nbytes)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


__all__ = ["OnnxFrontend", "onnx_opset", "MODEL_FILE", "DATA_FILE"]
