"""Lowered program -> saved ``.mlpackage``: coremltools' pass pipeline, flexible input shapes,
metadata, and an atomic write (a reader never sees a half-written package).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import coremltools as ct
import numpy as np
from coremltools.converters.mil.mil.passes.defs.quantization import add_fp16_cast
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from edgebuild.errors import BuildError, UsageError
from edgebuild_coreml.lowering.converter import ConvertResult

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
FP16_CAST_PASS = "common::add_fp16_cast"
GUARDED_FP16_CAST_PASS = "edgebuild::guarded_fp16_cast"


@register_pass(namespace="edgebuild")
class guarded_fp16_cast(add_fp16_cast):  # noqa: N801 - coremltools names a pass after its class
    """coremltools' fp16 cast pass, with the ops to keep in fp32 decided as it starts.

    Options: ``keep_fp32`` (op names) and ``before_cast(program) -> op names``, called on the
    program exactly as this pass sees it; the fp16 guard measures activation ranges there, so one
    pass pipeline serves both the measurement and the artifact. The check for fp32 constants fp16
    cannot hold scans in chunks: coremltools' own builds index arrays of three times a constant's
    size per dimension (several hundred MB for a BERT embedding table).
    """

    keep_fp32: Iterable[str] = ()
    before_cast: Callable | None = None

    def apply(self, prog):
        keep = set(self.keep_fp32)
        if self.before_cast is not None:
            keep.update(self.before_cast(prog))
        self.op_selector = lambda op: op.name not in keep
        super().apply(prog)

    @staticmethod
    def fp16_overflow(op) -> bool:
        from edgebuild_coreml.fp16_guard import FP16_MAX, MEANT_AS_INFINITY, max_finite_magnitude

        for inputs in op.inputs.values():
            for var in inputs if isinstance(inputs, (list, tuple)) else (inputs,):
                if var.op is None or var.op.op_type != "const" or not var.is_tensor_or_scalar_of(dtype="fp32"):
                    continue
                # Values meant as infinity may become fp16's inf; only real values must fit.
                if max_finite_magnitude(np.asarray(var.op.val.val), below=MEANT_AS_INFINITY) > FP16_MAX:
                    return True
        return False


@register_pass(namespace="edgebuild")
class collect_garbage(AbstractGraphPass):  # noqa: N801 - coremltools names a pass after its class
    """Frees the constants earlier passes replaced (the fp32 originals of fp16 weights): pymil
    graphs are cyclic, so without a collection they stay resident while the program is serialized."""

    def apply(self, prog):
        gc.collect()


def fp16_pipeline(keep_fp32: Iterable[str] | None, before_cast: Callable | None) -> ct.PassPipeline:
    """coremltools' default pipeline with its fp16 cast pass replaced by :class:`guarded_fp16_cast`,
    and a garbage collection at its end."""
    pipeline = ct.PassPipeline.DEFAULT
    for index in [i for i, name in enumerate(pipeline.passes) if name == FP16_CAST_PASS]:
        pipeline.remove_pass(index)
        pipeline.insert_pass(index, GUARDED_FP16_CAST_PASS)
    pipeline.append_pass("edgebuild::collect_garbage")
    pipeline.set_options(GUARDED_FP16_CAST_PASS, {"keep_fp32": frozenset(keep_fp32 or ()), "before_cast": before_cast})
    return pipeline


def compute_precision(precision: str, keep_fp32: Iterable[str] | None = None):
    if precision not in _PRECISIONS:
        raise UsageError(f"precision {precision!r} is not one of {', '.join(_PRECISIONS)}")
    if precision == "float32":
        return ct.precision.FLOAT32
    keep = frozenset(keep_fp32 or ())
    if not keep:
        return ct.precision.FLOAT16
    # Ops named in keep_fp32 (e.g. where fp16 would overflow) stay in fp32.
    return ct.transform.FP16ComputePrecision(op_selector=lambda op: op.name not in keep)


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


# -- atomic save ----------------------------------------------------------------------------
def save_atomically(model, path: Path) -> None:
    """Write beside ``path`` then rename, so ``path`` is either the old or the new package."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        staged = staging / path.name
        model.save(str(staged))
        if path.exists():  # move the old package aside; the staging dir's cleanup removes it
            os.rename(path, staging / "previous")
        os.rename(staged, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
    # coremltools' passes rewrite the program in place
    program = result.program if consume else copy.deepcopy(result.program)
    precision_option = compute_precision(precision, keep_fp32)
    pipeline = None
    if precision == "float16":
        precision_option, pipeline = ct.precision.FLOAT16, fp16_pipeline(keep_fp32, before_fp16_cast)
    try:
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
    except (ValueError, TypeError, NotImplementedError, AssertionError) as exc:
        raise BuildError(
            f"coremltools rejected the lowered program for {path.name}: {type(exc).__name__}: {exc}",
            hint="check the deployment target and input shapes; rerun with -v for the full trace",
        ) from exc
    apply_metadata(model, metadata)
    save_atomically(model, path)
    return model
