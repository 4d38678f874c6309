"""Lowered program -> saved ``.mlpackage``: coremltools' pass pipeline, flexible input shapes,
metadata, and an atomic write (a reader never sees a half-written package).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import coremltools as ct
import numpy as np
from coremltools.converters.mil.mil.block import InvalidBlockStateError

from edgebuild.plugin import BuildError, UsageError
from edgebuild_coreml.lowering.converter import ConvertResult
from edgebuild_coreml.lowering.names import METADATA_KEY, metadata_value
from edgebuild_coreml.lowering.nonreplaceable import propagated_only_when_needed
from edgebuild_coreml.lowering.passes import guarded_fp16_cast, pass_pipeline, validated_once  # noqa: F401

_PRECISIONS = ("float16", "float32")
_COMPUTE_UNITS = {
    "all": ct.ComputeUnit.ALL,
    "cpu_only": ct.ComputeUnit.CPU_ONLY,
    "cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU,
    "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE,
}
_MODEL_FIELDS = ("author", "license", "short_description", "version")
_NUMPY_OF = {"fp32": np.float32, "fp16": np.float16, "int32": np.int32}


# -- input shapes ---------------------------------------------------------------------------
def _dim(value, where: str):
    """int -> fixed; [lo, hi] -> a bounded range. Core ML ML Programs need every range bounded."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[1] is not None:
        return ct.RangeDim(lower_bound=int(value[0]), upper_bound=int(value[1]))
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise UsageError(
        f"{where} has no fixed size or bounded range ({value!r}); Core ML ML Programs need one",
        hint="give the input's shape in the recipe (source.inputs), with [low, high] for a flexible dim",
    )


def shape_spec(spec, where: str = "input") -> Any:
    """A coremltools shape for one input.

    ``spec`` is a ct.Shape/EnumeratedShapes (used as is), a list of dims (int, [lo, hi]
    or None), ``{"dims": [...]}`` likewise, or ``{"shapes": [[...], ...]}``: exactly
    these shapes (the first is the default).
    """
    if isinstance(spec, (ct.Shape, ct.EnumeratedShapes)):
        return spec
    if isinstance(spec, Mapping) and "shapes" in spec:
        shapes = [[int(d) for d in shape] for shape in spec["shapes"]]
        if len(shapes) == 1:
            return ct.Shape(shapes[0])
        return ct.EnumeratedShapes(shapes=shapes, default=shapes[0])
    dims = spec["dims"] if isinstance(spec, Mapping) else spec
    return ct.Shape([_dim(d, f"{where} dim {i}") for i, d in enumerate(dims)])


def input_types(result: ConvertResult, input_specs: Mapping[str, Any] | None) -> list:
    """One ct.TensorType per program input, named by its MIL name."""
    specs = dict(input_specs or {})
    unknown = set(specs) - set(result.input_names)
    if unknown:
        raise UsageError(
            f"input shapes given for {sorted(unknown)}, which are not inputs of the model "
            f"(inputs: {sorted(result.input_names)})",
            hint="use the ONNX graph input names",
        )
    types = []
    for onnx_name, mil_name in result.input_names.items():
        if onnx_name in specs:
            shape = shape_spec(specs[onnx_name], f"input {onnx_name!r}")
        else:
            shape = shape_spec(list(result.input_shapes.get(mil_name, ())), f"input {onnx_name!r}")
        dtype = _NUMPY_OF.get(result.input_dtypes.get(mil_name, "fp32"), np.float32)
        types.append(ct.TensorType(name=mil_name, shape=shape, dtype=dtype))
    return types


# -- precision ------------------------------------------------------------------------------
def compute_precision(precision: str):
    """coremltools' precision for ``precision`` (the ops the fp16 guard keeps are the pass list's business)."""
    if precision not in _PRECISIONS:
        raise UsageError(f"precision {precision!r} is not one of {', '.join(_PRECISIONS)}")
    return ct.precision.FLOAT16 if precision == "float16" else ct.precision.FLOAT32


# -- metadata -------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import edgebuild
    import edgebuild_coreml

    return {
        "edgebuild_version": getattr(edgebuild, "__version__", ""),
        "edgebuild_coreml_version": edgebuild_coreml.__version__,
        "coremltools_version": ct.__version__,
    }


def apply_metadata(model, metadata: Mapping[str, Any]) -> None:
    """author/license/short_description/version go to the model's fields; the rest (and the
    tool versions) to ``user_defined_metadata`` as strings."""
    entries = {**_versions(), **{k: v for k, v in metadata.items() if k not in _MODEL_FIELDS}}
    for key, value in entries.items():
        if value is None:
            continue
        model.user_defined_metadata[str(key)] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    for key in _MODEL_FIELDS:
        if metadata.get(key) is not None:
            setattr(model, key, str(metadata[key]))


# -- weight file ----------------------------------------------------------------------------
@contextlib.contextmanager
def weights_written_once():
    """Within: coremltools writes each float weight to the weight file from the array itself, and
    moves the weight file into the package it makes rather than copying it.

    Its serializer otherwise hands an fp16 weight to the file writer through two full copies
    (``flatten()``, then ``tobytes()``), and ``_create_mlpackage`` copies the finished weight file
    (gigabytes for a decoder) from its temporary directory into the temporary package. Module
    attributes of coremltools, restored after; the lower stages that run coremltools take turns
    (``Stage.extra["exclusive"]``)."""
    from coremltools.converters.mil.backend.mil import helper
    from coremltools.models import model as ct_model

    write, create = helper._get_offset_by_writing_data, ct_model._create_mlpackage
    helper._get_offset_by_writing_data = lambda var, writer: _write_float_blob(var, writer) or write(var, writer)
    ct_model._create_mlpackage = lambda spec, weights_dir=None, package_path=None: _package_moving_weights(
        create, spec, weights_dir, package_path)
    try:
        yield
    finally:
        helper._get_offset_by_writing_data, ct_model._create_mlpackage = write, create


def _write_float_blob(var, writer) -> int | None:
    """The offset of fp16/fp32 ``var`` written from its own (contiguous) array; None for other types."""
    from coremltools.converters.mil.mil import types

    from edgebuild_coreml.lowering.fp16_weights import in_c_order

    value = var.val
    if not isinstance(value, np.ndarray):
        return None
    if value.ndim == 2 and not value.flags.c_contiguous:  # a transposed view of an fp32 initializer
        value = in_c_order(value)
    if var.dtype == types.fp16 and value.dtype == np.float16:
        return writer.write_fp16_data(np.ascontiguousarray(value).reshape(-1).view(np.uint16))
    if var.dtype == types.fp32 and value.dtype == np.float32:
        return writer.write_float_data(np.ascontiguousarray(value).reshape(-1))
    return None


def _package_moving_weights(create, spec, weights_dir, package_path):
    """coremltools' ``_create_mlpackage`` given an empty weights directory, the files then moved in."""
    if weights_dir is None or not os.listdir(weights_dir):
        return create(spec, weights_dir, package_path)
    held = Path(tempfile.mkdtemp(prefix=".weights.", dir=Path(weights_dir).parent))
    names = os.listdir(weights_dir)
    try:
        for name in names:
            os.rename(Path(weights_dir) / name, held / name)
        path = create(spec, weights_dir, package_path)
        target = Path(path) / "Data" / "com.apple.CoreML" / "weights"
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.move(held / name, target / name)  # a rename on one file system
        return path
    finally:
        shutil.rmtree(held, ignore_errors=True)


# -- debug text ------------------------------------------------------------------------------
@contextlib.contextmanager
def program_text_only_when_logged():
    """Within: a pymil program formats itself as text only when coremltools' debug log is on.

    coremltools' pass pipeline puts the whole program into a debug message before and after
    each pipeline as an f-string, which formats every op even though the message is dropped
    (tens of ms on a conv net). ``Program.__str__`` is a class attribute of coremltools, restored
    after; the lower stages that run coremltools take turns (``Stage.extra["exclusive"]``)."""
    import logging

    from coremltools import _logger
    from coremltools.converters.mil.mil.program import Program

    if _logger.isEnabledFor(logging.DEBUG):
        yield
        return
    text = Program.__str__
    Program.__str__ = lambda self: "<MIL program; its text is formatted with coremltools' debug log on>"
    try:
        yield
    finally:
        Program.__str__ = text


# -- atomic save ----------------------------------------------------------------------------
def save_atomically(model, path: Path) -> None:
    """Write beside ``path`` then rename, so ``path`` is either the old or the new package."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        staged = staging / path.name
        save_package(model, staged)
        if path.exists():  # move the old package aside; the staging dir's cleanup removes it
            os.rename(path, staging / "previous")
        os.rename(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def link_weight_files(src: str, dst: str) -> str:
    """``copytree``'s copy function for packages: a file in ``weights/`` is hard-linked (written
    once by coremltools and never changed, gigabytes for a decoder), anything else copied."""
    if Path(src).parent.name == "weights":
        from edgebuild.plugin.store import link_vouched

        try:
            link_vouched(src, dst)  # the digest the store knows of src holds for dst: not hashed again
            return dst
        except OSError:  # another file system, or no hard links there
            pass
    return shutil.copy2(src, dst)


def save_package(model, path: Path) -> None:
    """``model.save(path)`` for a package coremltools wrote to a temporary directory, with the
    weight files linked rather than copied; the spec (as edited since) is written anew."""
    from coremltools.models.model import _get_model_spec_path

    source = getattr(model, "package_path", None)
    if not getattr(model, "is_package", False) or not source or not os.path.isdir(source):
        model.save(str(path))
        return
    shutil.copytree(source, path, copy_function=link_weight_files)
    spec_path = Path(_get_model_spec_path(str(path)))
    spec_path.unlink()
    spec_path.write_bytes(model.get_spec().SerializeToString())


def save_mlpackage(
    result: ConvertResult,
    path: str | os.PathLike,
    *,
    target: str,
    precision: str,
    input_specs: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any],
    compute_units: str | ct.ComputeUnit | None = None,
    keep_fp32: Iterable[str] | None = None,
    before_fp16_cast: Callable | None = None,
    consume: bool = False,
    passes: str = "lowering",
):
    """Run coremltools' mlprogram pipeline on ``result.program`` and save it to ``path``.

    ``input_specs``: {ONNX input name: shape spec} for flexible inputs (see
    :func:`shape_spec`); inputs not named keep the program's shape (a symbolic dim
    without a spec is an error: Core ML needs bounds). ``keep_fp32``: MIL op names left in fp32 under float16 precision.
    ``before_fp16_cast(program) -> op names``: under float16, called on the program as the fp16
    cast pass sees it (after coremltools' optimisation passes); the names it returns stay in fp32 too.
    ``consume``: let coremltools' passes rewrite ``result.program`` in place instead of working on a
    deep copy; a caller that lowers once saves the copy's memory (a second set of weights) and
    its recursion through every op of a large graph.
    ``passes``: ``"lowering"``, the passes a lowered ONNX graph needs (see ``lowering.passes``), or
    ``"default"``, coremltools' full default pipeline (kept to compare against).
    Returns the MLModel (not loaded: Core ML cannot run here); its ``_mil_program`` is the program
    as saved.
    """
    path = Path(path)
    if path.suffix != ".mlpackage":
        raise UsageError(f"{path}: a Core ML ML Program is saved as a directory ending in .mlpackage")
    if not hasattr(ct.target, target):
        raise UsageError(f"unknown deployment target {target!r}", hint="use one of iOS15..iOS18, iOS26")
    units = _COMPUTE_UNITS.get(compute_units, compute_units) if isinstance(compute_units, str) else compute_units
    if isinstance(compute_units, str) and compute_units not in _COMPUTE_UNITS:
        raise UsageError(f"compute_units {compute_units!r} is not one of {', '.join(_COMPUTE_UNITS)}")
    if result.stateful is not None:  # input_ids takes the query lengths, position is fixed
        from edgebuild_coreml.lowering.stateful import METADATA_KEY as GENERATE_KEY

        input_specs = result.stateful.input_specs()
        metadata = {**metadata, GENERATE_KEY: result.stateful.description()}
    # coremltools' passes rewrite the program in place
    program = result.program if consume else copy.deepcopy(result.program)
    precision_option = compute_precision(precision)
    pipeline = pass_pipeline(precision, keep_fp32=keep_fp32, before_cast=before_fp16_cast, passes=passes)
    try:
        with validated_once(program), propagated_only_when_needed(program), weights_written_once(), \
                program_text_only_when_logged():
            model = ct.convert(
                program,
                convert_to="mlprogram",
                minimum_deployment_target=getattr(ct.target, target),
                compute_precision=precision_option,
                pass_pipeline=pipeline,
                inputs=input_types(result, input_specs),
                compute_units=units or ct.ComputeUnit.ALL,
                skip_model_load=True,
            )
    except (ValueError, TypeError, NotImplementedError, AssertionError, InvalidBlockStateError) as exc:
        raise BuildError(
            f"coremltools rejected the lowered program for {path.name}: {type(exc).__name__}: {exc}",
            hint="check the deployment target and input shapes; rerun with -v for the full trace",
        ) from exc
    check_public_names(model, result, path.name)
    names = metadata_value(result.input_names, result.output_names)
    apply_metadata(model, {**metadata, **({METADATA_KEY: names} if names else {})})
    _describe_renamed(model, result)
    save_atomically(model, path)
    return model


def _describe_renamed(model, result: ConvertResult) -> None:
    """A renamed feature says its ONNX name where Xcode shows the model's inputs and outputs."""
    for role, names, descriptions in (("input", result.input_names, model.input_description),
                                      ("output", result.output_names, model.output_description)):
        for onnx_name, artifact_name in names.items():
            if onnx_name != artifact_name:
                descriptions[artifact_name] = f"ONNX {role} {onnx_name!r}"


def check_public_names(model, result: ConvertResult, artifact: str) -> None:
    """The saved model's inputs and outputs are the names the lowering chose (coremltools renames
    on its own what Core ML would not accept; a name it changed would be lost to every caller)."""
    description = model.get_spec().description
    for role, names, features in (("input", result.input_names, description.input),
                                  ("output", result.output_names, description.output)):
        saved = [feature.name for feature in features]
        if sorted(saved) != sorted(names.values()):
            raise BuildError(
                f"{artifact}: coremltools saved the {role}s as {saved}, not as the names the lowering chose "
                f"({sorted(names.values())})",
                hint="a name rule of this coremltools version is unknown to edgebuild "
                     "(edgebuild_coreml.lowering.names); report it with the model's input and output names")


def write_package(src: Path, dst: Path, metadata: Mapping[str, Any], *, source_sha256: str) -> dict:
    """The package stage: ``src`` with the recipe's metadata, the source's digest and the versions
    that built it in its description, as ``dst``; the stage's info."""
    from coremltools.models.model import _get_model_spec_path

    # The package is the lowered one with more metadata: its weight files (gigabytes for a
    # decoder) are hard links to the stage before's, only the spec is written anew.
    spec = ct.utils.load_spec(str(src))
    meta = spec.description.metadata
    meta.author = metadata.get("author") or meta.author
    meta.license = metadata.get("license") or meta.license
    meta.shortDescription = metadata.get("description") or meta.shortDescription
    if metadata.get("version"):
        meta.versionString = metadata["version"]
    user = meta.userDefined
    user["com.edgebuild.source_sha256"] = source_sha256
    user["com.edgebuild.recipe"] = metadata["recipe"]
    user["com.edgebuild.variant"] = metadata["variant"]
    user["com.edgebuild.compute_policy"] = metadata["compute_policy"]
    for name, version in metadata["versions"].items():
        user[f"com.edgebuild.version.{name}"] = version
    shutil.copytree(src, dst, copy_function=link_weight_files)
    spec_path = Path(_get_model_spec_path(str(dst)))
    spec_path.unlink()
    spec_path.write_bytes(spec.SerializeToString())
    return {"size_bytes": sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())}
