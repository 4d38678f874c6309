"""fp16 overflow guard: find the ops whose activations leave the fp16 range and keep them fp32.

fp16 tops out at 65504; an activation beyond that becomes inf in a float16 artifact and usually
turns the outputs into NaN. The guard runs the fp32 program on calibration inputs at the point
of coremltools' pass pipeline where the fp16 cast pass is about to run (so op names are exactly
the ones that pass sees; see ``lowering.package.guarded_fp16_cast``), records each op's largest
output magnitude, and names the ops to leave in fp32: every op whose output goes out of range or
that reads a constant fp16 cannot hold, plus every op that reads such an output (it would cast
it down to fp16 on input). Constants meant as infinity are saturated first
(``saturate_infinite_constants``), so attention masks stay in fp16. Given the recipe's
``cosine_min``, it also keeps in fp32 the fewest ops whose fp16 rounding would take the outputs
below it (``fp16_sensitivity``).

Memory: weights are scanned in chunks and activations are dropped after their last reader, so
the guard adds little to a conversion's peak (a full-resolution conv net's activations, or the
float64 copy of a BERT embedding table, would otherwise outweigh the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from edgebuild_coreml.compute import FP16_GUARD_SAMPLES as MAX_CALIBRATION_SAMPLES
from edgebuild_coreml.fp16_sensitivity import PrecisionResult, find_sensitive_ops
from edgebuild_coreml.interpreter.half_rounding import FP16_MAX
from edgebuild_coreml.interpreter.executor import input_vars
from edgebuild_coreml.memory import heap_blocks_reused, return_freed_memory

# Constants this large (attention masks built from float32's min, say) stand for infinity, as
# coremltools also assumes. The guard turns them into SATURATED: still "minus infinity" to a softmax,
# with headroom for the scores a mask is added to.
MEANT_AS_INFINITY = 1e38
SATURATED = FP16_MAX / 2
# Elements per step of a scan over a large array: its temporaries (a few chunk-sized arrays)
# stay well below one activation of a full-resolution image model.
SCAN_CHUNK = 1 << 16
DROP_PAGES_ELEMENTS = 1 << 20  # max_finite_magnitude(drop_pages=True) drops this many at a time
CAST_SUFFIX = "_cast_fp16"  # coremltools' add_fp16_cast names an op's fp16 copy so


@dataclass
class GuardResult:
    overflowing: dict[str, float]  # op name -> largest |output| seen
    readers: list[str]  # ops reading an overflowing output
    checked_samples: int
    ranges: dict[str, float] = field(default_factory=dict, repr=False)  # op name -> max |output|
    # op name -> the names of its float outputs, for every op kept in fp32: the island as values.
    # Later passes may recreate an op under a new name (topological_reorder moves every transpose
    # and cast that way) but keep its output's name, so the saved program is checked by value.
    island_values: dict[str, list[str]] = field(default_factory=dict, repr=False)
    precision: PrecisionResult | None = None  # the search for the recipe's cosine_min, when it has one

    @property
    def keep_fp32(self) -> set[str]:
        return set(self.overflowing) | set(self.readers) | set(self.precision.kept if self.precision else ())

    def to_json(self) -> dict:
        found = {
            "kept_fp32": [{"op": name, "max_abs": value} for name, value in self.overflowing.items()],
            "readers_kept_fp32": list(self.readers),
            "checked_samples": self.checked_samples,
        }
        if self.precision is not None:
            found["precision"] = self.precision.to_json()
        return found


# -- calibration inputs -----------------------------------------------------------------------


def calibration_samples(section, source_path: Path, recipe_inputs: Mapping[str, Any], base_dir: Path,
                        input_names: Mapping[str, str]) -> Iterator[dict[str, np.ndarray]]:
    """Up to MAX_CALIBRATION_SAMPLES inputs for the program, keyed by its (MIL) input names,
    made one at a time as the guard runs them (a full-resolution image is megabytes).

    The recipe's ``validate`` inputs when it has a section, else uniform random values in [0, 1).
    Fixed-value inputs are folded into the model, so they are not fed.
    """
    from edgebuild.plugin.validation import onnx_input_specs
    from edgebuild.plugin.validation import ValidateSection
    from edgebuild.plugin.validation import iter_inputs

    specs = onnx_input_specs(source_path, recipe_inputs)
    free = {name: spec for name, spec in specs.items() if "value" not in spec}
    if section is None:
        section = ValidateSection(samples=MAX_CALIBRATION_SAMPLES)
    count = min(section.samples, MAX_CALIBRATION_SAMPLES)
    section = section.model_copy(update={"samples": count})
    samples = iter_inputs(section, free, base_dir)
    return ({input_names.get(name, name): value for name, value in sample.items() if name in input_names}
            for sample in samples)


# -- ranges -----------------------------------------------------------------------------------


def max_finite_magnitude(array: np.ndarray, *, below: float = np.inf, drop_pages: bool = False) -> float:
    """Largest |x| over the finite elements of a float ``array`` that are below ``below``; 0.0 if none.

    Scanned in chunks: a whole-array ``abs`` (or a float64 copy) of a large weight would cost more
    memory than the weight itself. ``drop_pages``: a read-only array viewing a mapped file has
    each chunk's pages dropped once scanned, so the scan leaves no more than a chunk resident.
    """
    from edgebuild_coreml.memory import drop_mapped_pages

    peak = 0.0
    # memory order: a view for any dense layout (reshape(-1) would copy a transposed weight whole)
    flat = np.ravel(array, order="K")
    dropped = 0  # pages go a few MB at a time: a system call per 256 KB chunk is not worth it
    for start in range(0, flat.size, SCAN_CHUNK):
        chunk = flat[start:start + SCAN_CHUNK]
        # the usual chunk (all finite, all below ``below``): its largest magnitude from two
        # reductions, without the |x| and mask temporaries; NaN or inf in it fail the test
        high, low = float(np.max(chunk)), float(np.min(chunk))
        if np.isfinite(high) and np.isfinite(low) and max(high, -low) < below:
            peak = max(peak, high, -low)
        else:
            magnitudes = np.abs(chunk)
            keep = np.isfinite(magnitudes) & (magnitudes < below)
            peak = max(peak, float(np.max(magnitudes, where=keep, initial=0.0)))
        end = min(start + SCAN_CHUNK, flat.size)
        if drop_pages and (end - dropped >= DROP_PAGES_ELEMENTS or end == flat.size):
            drop_mapped_pages([flat[dropped:end]])
            dropped = end
    return peak


def _max_abs(value) -> float | None:
    """Largest finite magnitude in a float array (inf and NaN look the same in fp16 and fp32)."""
    array = np.asarray(value)
    if array.dtype.kind != "f" or array.size == 0:
        return None
    return max_finite_magnitude(array)


def _activation_peak(value) -> float | None:
    """``_max_abs`` of an op's output: one max and one min over the whole array, which covers
    the usual all-finite activation without the chunked scan's per-chunk calls."""
    array = np.asarray(value)
    if array.dtype.kind != "f" or array.size == 0:
        return None
    high, low = float(np.max(array)), float(np.min(array))
    if np.isfinite(high) and np.isfinite(low):
        return max(high, -low, 0.0)
    return max_finite_magnitude(array)


def activation_ranges(program, samples: Iterable, outputs: list | None = None) -> dict[str, float]:
    """Largest |output| of every float-producing op over ``samples`` (read once, in order);
    ``outputs``, if given, gets each sample's program outputs.

    The runs use one BLAS thread: the interpreter's matrix products (a conv's tile of windows,
    a transformer's projections) are too small for OpenBLAS's pool to share, whose threads wait
    on each other instead; on a busy machine that made the guard several times slower than one
    thread, and on an idle one it was no faster.
    """
    from edgebuild.plugin import blas_threads

    ranges: dict[str, float] = {}

    def observe(op, outputs) -> None:
        peaks = [m for m in map(_activation_peak, outputs) if m is not None]
        if peaks:
            ranges[op.name] = max(max(peaks), ranges.get(op.name, 0.0))

    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.interpreter.plan import forget_plans

    with blas_threads(1), heap_blocks_reused():
        try:
            for sample in samples:
                answer = run_program(program, sample, observer=observe)
                if outputs is not None:
                    outputs.append(answer)
                return_freed_memory()  # else each run's freed activations stay resident, and add up
        finally:
            forget_plans(program)  # the cast pass rewrites the program next: its plan would pin old ops
    return ranges


def _all_ops(block):
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _all_ops(inner)


def readers_of(program, producers: set[str]) -> list[str]:
    """Ops (outside ``producers``) reading an output of one of ``producers``."""
    found = []
    for op in _all_ops(program.functions["main"]):
        if op.name in producers:
            continue
        if any(var.op is not None and var.op.name in producers for var in input_vars(op)):
            found.append(op.name)
    return found


def saturate_infinite_constants(program) -> list[str]:
    """Replace float constants meant as infinity by +-SATURATED in place; returns the consts changed.

    Cast to fp16 they would become inf, and 0 * inf is NaN where fp32 gave 0 (a mask scaled by
    float32's min, on the tokens it does not mask).
    """
    from coremltools.converters.mil import Builder as mb

    changed = []
    for op in list(_all_ops(program.functions["main"])):
        if op.op_type != "const" or not op.outputs[0].child_ops:
            continue
        value = op.outputs[0].val
        array = np.asarray(value)
        if array.dtype.kind != "f" or array.size == 0:
            continue
        if max_finite_magnitude(array) < MEANT_AS_INFINITY:  # the common case, without temporaries
            continue
        huge = np.isfinite(array) & (np.abs(array) >= MEANT_AS_INFINITY)
        saturated = np.where(huge, np.sign(array) * SATURATED, array).astype(array.dtype)
        block = op.enclosing_block
        with block:
            replacement = mb.const(val=saturated if array.ndim else saturated[()], before_op=op,
                                   name=f"{op.name}_fp16_saturated")
        block.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=replacement)
        block.remove_ops([op])
        changed.append(op.name)
    return changed


def constant_overflows(program, limit: float = FP16_MAX) -> dict[str, float]:
    """Ops reading a float constant beyond the fp16 range, e.g. an attention mask scaled by float32's
    min. In fp16 the constant becomes inf, and 0 * inf is NaN even where fp32 gives 0; calibration
    inputs without padding would never show it."""
    found = {}
    for op in _all_ops(program.functions["main"]):
        if op.op_type == "const":
            continue
        peaks = [_max_abs(var.val) for var in input_vars(op) if var.val is not None]
        peak = max((m for m in peaks if m is not None), default=0.0)
        if peak > limit:
            found[op.name] = peak
    return found


def find_overflows(program, samples, *, limit: float = FP16_MAX, cosine_min: float | None = None,
                   judge=None) -> GuardResult:
    """Run ``program`` (fp32) on ``samples`` and name the ops fp16 could not hold; with
    ``cosine_min``, also the ops to keep in fp32 for the outputs to stay within it, as ``judge``
    (a ``fp16_sensitivity.Judge``: validation's detection matching, say) scores them."""
    from edgebuild.plugin import blas_threads
    from edgebuild_coreml.interpreter import ort_kernels

    checked = 0
    kept_samples: list | None = [] if cosine_min is not None else None  # the search reruns them
    references: list | None = [] if cosine_min is not None else None

    def counted():
        nonlocal checked
        for sample in samples:
            checked += 1
            if kept_samples is not None:
                kept_samples.append(sample)
            yield sample

    # onnxruntime's convolutions for every run of the guard, the references' and the estimate's alike
    # (a detector's heads: 4-6x numpy's); the choice is the guard's own, whatever else runs
    with ort_kernels.for_calls():
        ranges = activation_ranges(program, counted(), references)
    overflowing = {name: peak for name, peak in ranges.items() if peak > limit}
    for name, peak in constant_overflows(program, limit).items():
        overflowing.setdefault(name, peak)
    readers = readers_of(program, set(overflowing)) if overflowing else []
    precision = None
    if cosine_min is not None and kept_samples:
        from edgebuild_coreml.interpreter.plan import forget_plans

        with blas_threads(1), heap_blocks_reused(), ort_kernels.for_calls():
            try:
                precision = find_sensitive_ops(program, kept_samples, references, cosine_min=cosine_min,
                                               keep=set(overflowing) | set(readers), judge=judge)
            finally:
                forget_plans(program)
    result = GuardResult(overflowing=overflowing, readers=readers, checked_samples=checked, ranges=ranges,
                         precision=precision)
    result.island_values = float_outputs_of(program, result.keep_fp32)
    return result


def float_outputs_of(program, names: set[str]) -> dict[str, list[str]]:
    """{op name: names of its float outputs} for the ops of ``program`` named in ``names``."""
    from coremltools.converters.mil.mil import types

    return {op.name: [v.name for v in op.outputs if v.dtype in (types.fp16, types.fp32)]
            for op in _all_ops(program.functions["main"]) if op.name in names}


# -- check the saved artifact -----------------------------------------------------------------


def ops_not_fp32(program, names) -> list[str]:
    """Names in ``names`` that are missing from ``program`` or produce a non-fp32 float output."""
    from coremltools.converters.mil.mil import types

    by_name = {op.name: op for op in _all_ops(program.functions["main"])}
    wrong = []
    for name in names:
        op = by_name.get(name)
        if op is None:
            wrong.append(name)
            continue
        float_outputs = [v for v in op.outputs if v.dtype in (types.fp16, types.fp32)]
        if any(v.dtype != types.fp32 for v in float_outputs):
            wrong.append(name)
    return wrong


@dataclass
class IslandCheck:
    """How the guard's islands came through the passes after the cast, in the saved program."""

    in_fp16: dict[str, list[str]]  # op kept fp32 -> its values the saved program computes in fp16
    kept: dict[str, list[str]]  # op kept fp32 -> its values the saved program computes in fp32
    folded: list[str]  # ops none of whose values is left (eliminated, folded or fused into a reader)

    def to_json(self) -> dict:
        return {"fp32": sorted(self.kept), "folded_away": sorted(self.folded)}


def check_islands(program, island_values: Mapping[str, list[str]]) -> IslandCheck:
    """Find each value of the guard's islands in the saved ``program`` by name.

    A value is the island's whichever op now makes it (passes after the cast recreate ops under new
    names and keep their outputs' names). One the program computes in fp16 is the failure this
    check exists for. One the program no longer holds was removed by a pass that keeps dtypes
    (a no-op or constant folded away, an op fused into its reader, which reads fp32 and is in the
    island itself): its readers carry the check.
    """
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.passes.defs.preprocess import NameSanitizer

    made_by = {v.name: v for op in _all_ops(program.functions["main"]) for v in op.outputs}

    def sanitized(name: str) -> str:  # what the backend's sanitize pass makes of a name (a fresh sanitizer:
        return NameSanitizer(prefix="var_").sanitize_name(name)  # one remembers names, and numbers repeats)

    def computed_in_fp16(name: str) -> bool:
        # fp16 itself, or an fp16 value cast up under the island's name (no island op is such a
        # cast: the guard measured an all-fp32 program)
        value = made_by[name]
        return value.dtype == types.fp16 or (value.op.op_type == "cast" and value.op.x.dtype == types.fp16)

    def found(name: str) -> str | None:
        return next((n for n in (name, sanitized(name)) if n in made_by), None)

    in_fp16, kept, folded = {}, {}, []
    for op_name, values in island_values.items():
        present = [found(v) for v in values if found(v)]
        fp16 = [v for v in present if computed_in_fp16(v)]
        # the fp16 copy coremltools' cast pass makes of an op it did cast, named after it
        fp16 += [found(v + CAST_SUFFIX) for v in values if not found(v) and found(v + CAST_SUFFIX)]
        if fp16:
            in_fp16[op_name] = fp16
        elif present:
            kept[op_name] = present
        else:
            folded.append(op_name)
    return IslandCheck(in_fp16, kept, folded)
