"""The MIL passes a lowered program goes through before it is saved, and how they are run.

coremltools' default pipeline (~95 passes) is written for its PyTorch and TensorFlow frontends:
most of it fuses patterns (conv + bn, gelu, layer norm, ...) that the ONNX optimiser has already
fused, or that the lowering emits as single MIL ops anyway. ``LOWERING`` keeps, in coremltools'
order, what a lowered ONNX graph needs: folding and dead-code cleanup, the fp16 casts, the
gather-index guard, the constexpr rewrites for quantized weights and the name and order
canonicalisation the serializer expects. ``DEFAULT`` (coremltools' own list) stays reachable
for comparison: the tests build the dev models both ways and compare op lists and outputs.

coremltools also validates the whole program after every pass (and after each of its backend
passes); :func:`validated_once` checks it once, after the last one.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Callable, Iterable

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Var, types
from coremltools.converters.mil.mil.passes.defs.quantization import add_fp16_cast
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from edgebuild_coreml.lowering.fp16_weights import MIN_ELEMENTS as FP16_WEIGHT_ELEMENTS
from edgebuild_coreml.lowering.fp16_weights import WeightCasts
from edgebuild_coreml.memory import drop_mapped_pages, views_read_only_mmap

FP16_CAST_PASS = "common::add_fp16_cast"
# fp32 constants of this many elements or more are folded to fp16 as soon as they are cast
FOLD_AT_ONCE_ELEMENTS = 4096
COLLECT_EVERY_BYTES = 256 << 20
UNDERFLOW_CHECK_MAX_ELEMENTS = 400  # coremltools' add_fp16_cast: larger constants are not checked
GUARDED_FP16_CAST_PASS = "edgebuild::guarded_fp16_cast"
COLLECT_GARBAGE_PASS = "edgebuild::collect_garbage"
DROP_WEIGHT_PAGES_PASS = "edgebuild::drop_weight_pages"
RECIPROCAL_PASS = "edgebuild::divide_to_multiply"
PIPELINES = ("lowering", "default")

# Each pass once where one run settles it; coremltools' backend pipeline (run by ct.convert after
# these) repeats const elimination, const deduplication, cast optimisation, dead-code elimination
# and name deduplication, so the list need not end with them.
_BEFORE_CAST = [
    "common::noop_elimination",  # Identity nodes, reshapes to the same shape
    "common::const_elimination",  # shape arithmetic on static shapes
    RECIPROCAL_PASS,  # Div by a constant -> Mul by its reciprocal, unless the quotient is rounded
    "common::const_deduplication",  # weights an exporter stored twice
    DROP_WEIGHT_PAGES_PASS,  # what the deduplication read of mapped weights
    "common::remove_symbolic_reshape",  # reshapes to flexible (RangeDim) shapes
    "common::loop_invariant_elimination",  # values a Loop body passes through unchanged
    "common::fuse_transpose_matmul",  # ONNX Transpose feeding MatMul -> matmul(transpose_y=True)
    "common::dead_code_elimination",
    "common::dedup_op_and_var_names",  # the fp16 cast pass names its casts from a unique-name cache
]
_FP16_CASTS = [
    FP16_CAST_PASS,
    "common::add_int16_cast",
    "common::update_output_dtypes",  # after the casts
]
_AFTER_CAST = [
    "common::guard_negative_gather_indices",  # ONNX allows negative gather indices
    "common::const_elimination",
    "common::dead_code_elimination",
    "common::cast_optimization",
    "common::dead_code_elimination",  # must follow cast_optimization
]
_FP16_CLEANUP = [
    "common::add_int16_cast",  # guard_negative_gather_indices may add int32 casts
    "common::const_elimination",
    "common::dead_code_elimination",
    "common::cast_optimization",
    "common::dead_code_elimination",
]
_FINISH = [
    "common::merge_affine_dequantize_with_consecutive_ops",  # quantized weights (constexpr ops)
    "common::expand_dynamic_linear",  # linear whose weight is not a constant -> matmul + add
    "common::noop_elimination",
    "common::dedup_op_and_var_names",
    "common::topological_reorder",
    "common::dead_code_elimination",
]


def lowering_passes(precision: str) -> list[str]:
    """The curated pass list for ``precision`` (``float16`` adds the casts and their cleanup)."""
    if precision == "float16":
        # Deduplicated by the backend pipeline after the casts instead, on fp16 values in memory:
        # before them the lowered weights are views of their mapped file, and hashing a transposed
        # view flattens it, which would read every weight (and keep its pages resident) at once.
        before = [name for name in _BEFORE_CAST if name not in ("common::const_deduplication", DROP_WEIGHT_PAGES_PASS)]
        return before + _FP16_CASTS + _AFTER_CAST + _FP16_CLEANUP + _FINISH
    return _BEFORE_CAST + _AFTER_CAST + _FINISH


@register_pass(namespace="edgebuild")
class divide_to_multiply(AbstractGraphPass):  # noqa: N801 - coremltools names a pass after its class
    """``x / c`` -> ``x * (1 / c)`` for a constant float divisor, as coremltools' pass of that name
    does, except where the quotient is rounded (a quantiser's ``round(x / scale)``) or is itself
    a scale such a quotient divides by (a dynamic quantiser's ``range / 255``). The product by
    the reciprocal differs from the quotient in the last bit now and then: on a rounding tie that
    is a whole quantisation step away from what onnxruntime's division gives, and in a scale it
    moves every value dequantised with it."""

    def apply(self, prog):
        for function in prog.functions.values():
            _reciprocal_products(function)


def _reciprocal_products(block) -> None:
    with block:
        for op in list(block.operations):
            for inner in op.blocks:
                _reciprocal_products(inner)
            if op.blocks or op.op_type != "real_div" or op.y.val is None or not types.is_float(op.x.dtype):
                continue
            if _rounded(op.outputs[0]) or _divides_a_rounded_quotient(op.outputs[0]):
                continue
            reciprocal = np.array(1.0, dtype=op.y.val.dtype) / op.y.val
            if not np.isfinite(reciprocal).all():
                continue
            product = mb.mul(x=op.x, y=reciprocal, name=f"_inversed_{op.name}", before_op=op)
            op.enclosing_block.replace_uses_of_var_after_op(anchor_op=op, old_var=op.outputs[0], new_var=product)
            block.remove_ops([op])


def _rounded(var) -> bool:
    return any(reader.op_type == "round" for reader in var.child_ops)


def _divides_a_rounded_quotient(var) -> bool:
    """Whether ``var`` is the divisor of a rounded quotient, directly or through a select (the
    dynamic quantiser's guard that gives an all-zero tensor scale 1)."""
    for reader in var.child_ops:
        if reader.op_type == "real_div" and reader.y is var and _rounded(reader.outputs[0]):
            return True
        if reader.op_type == "select" and _divides_a_rounded_quotient(reader.outputs[0]):
            return True
    return False


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
        islands = {op.name for op in _float_ops(prog) if op.name in keep}
        # each large weight is cast once, as its overflow is checked, and its cast op takes that value
        with WeightCasts(_large_fp32_bytes(prog)).serving_casts() as casts:
            self._casts = casts
            try:
                super().apply(prog)
            finally:
                self._casts = None
        _check_islands_cast_fp32(prog, islands)

    _casts: WeightCasts | None = None

    def is_valid_op(self, op) -> bool:
        if op.op_type in self._UNSUPPORTED_FP16_OPS or (self.op_selector is not None and not self.op_selector(op)):
            return False  # (not selected: its weights need no fp16 copy)
        if self._casts is None:
            return not self.fp16_overflow(op)
        return not any(self._casts.overflows(var) if np.size(var.val) >= FP16_WEIGHT_ELEMENTS else _overflows(var)
                       for var in _fp32_consts(op))

    def transform_op(self, op):
        weights = [var for var in _const_inputs(op) if var.is_tensor_or_scalar_of(dtype="fp32")
                   and np.size(var.val) >= FOLD_AT_ONCE_ELEMENTS]
        super().transform_op(op)
        for var in weights:
            self._freed_bytes += _fold_fp16_casts(var)
        if self._freed_bytes >= COLLECT_EVERY_BYTES:
            gc.collect()  # pymil graphs are cyclic: the fp32 values go (and their pages unmap) only now
            self._freed_bytes = 0

    _freed_bytes = 0

    def _check_underflow_to_zero(self, new_var, var):
        # coremltools' check, element for element the same, in one pass over the array: its own
        # calls np.isclose per element (1.2 s over a 22-layer decoder's small constants) and counts
        # a constant's size with ``val.flatten()``, a full fp32 copy of every weight.
        flushed = underflow_flushed(var.val, new_var.val)
        if flushed is not None:
            new_var._sym_val.val = flushed

    @staticmethod
    def fp16_overflow(op) -> bool:
        return any(_overflows(var) for var in _fp32_consts(op))


def _float_ops(prog):
    def walk(block):
        for op in block.operations:
            if any(v.dtype in (types.fp16, types.fp32) for v in op.outputs):
                yield op
            for inner in op.blocks:
                yield from walk(inner)

    for function in prog.functions.values():
        yield from walk(function)


def _check_islands_cast_fp32(prog, islands: set[str]) -> None:
    """Every op kept in fp32 is still there, under its name, with fp32 outputs, right after the cast:
    here names are exact (the passes after it may recreate an op under another name, and the lower
    stage checks the saved program by the islands' values instead)."""
    from edgebuild.plugin import BuildError

    found = {op.name: op for op in _float_ops(prog) if op.name in islands}
    wrong = sorted(name for name in islands
                   if name not in found or any(v.dtype == types.fp16 for v in found[name].outputs))
    if wrong:
        raise BuildError(f"the fp16 cast pass was asked to keep {', '.join(wrong)} in fp32, but cast them to fp16",
                         hint="set target.precision: float32, or compute.fp16_guard: false to accept the overflow")


def _large_fp32_bytes(prog) -> int:
    """Bytes of the fp32 constants the cast pass casts through ``WeightCasts``."""
    return sum(np.size(op.outputs[0].val) * 4 for function in prog.functions.values()
               for op in function.find_ops(op_type="const")
               if op.outputs[0].is_tensor_or_scalar_of(dtype="fp32") and np.size(op.outputs[0].val) >= FP16_WEIGHT_ELEMENTS)


def _fp32_consts(op) -> list:
    return [var for inputs in op.inputs.values() for var in (inputs if isinstance(inputs, (list, tuple)) else (inputs,))
            if var.op is not None and var.op.op_type == "const" and var.is_tensor_or_scalar_of(dtype="fp32")]


def underflow_flushed(original, cast):
    """``cast`` (the fp16 cast of fp32 constant ``original``) with every nonzero value the cast
    made zero set to the smallest fp16 subnormal of its sign, as coremltools' fp16 pass does for
    constants under UNDERFLOW_CHECK_MAX_ELEMENTS elements (an epsilon must not become 0); None
    when nothing changes or the constant is larger."""
    if original is None or cast is None or np.size(original) >= UNDERFLOW_CHECK_MAX_ELEMENTS:
        return None
    tiny16, tiny32 = np.nextafter(np.float16(0), np.float16(1)), np.nextafter(np.float32(0), np.float32(1))
    before, after = np.asarray(original).reshape(-1), np.array(cast).reshape(-1)  # (a copy of the cast)
    flushed = (np.abs(after) <= tiny16) & ~(np.abs(before) <= tiny32)  # coremltools' isclose(x, 0) tests
    if not flushed.any():
        return None
    after[flushed] = np.where(before[flushed] > 0, tiny16, -tiny16)
    return after[0] if np.isscalar(cast) else after.reshape(np.shape(cast))


def _overflows(var) -> bool:
    """Whether the fp32 constant ``var`` holds a real value beyond fp16's range (values meant as
    infinity may become fp16's inf). A mapped weight's pages go as they are scanned."""
    from edgebuild_coreml.fp16_guard import FP16_MAX, MEANT_AS_INFINITY, max_finite_magnitude

    return max_finite_magnitude(np.asarray(var.op.val.val), below=MEANT_AS_INFINITY, drop_pages=True) > FP16_MAX


def _const_inputs(op) -> list:
    found = []
    for inputs in op.inputs.values():
        for var in inputs if isinstance(inputs, (list, tuple)) else (inputs,):
            if var.op is not None and var.op.op_type == "const" and var.val is not None and var not in found:
                found.append(var)
    return found


def _fold_fp16_casts(var) -> int:
    """Replace the fp16 casts of the fp32 constant ``var`` by fp16 constants and remove ``var``,
    once every reader of it reads a cast; returns the bytes of fp32 values dropped.

    coremltools' cast pass leaves ``const -> cast`` pairs for ``const_elimination`` to fold after
    the whole program was cast, so every fp32 weight would live beside its fp16 copy until then
    (three bytes per two of the result, or the mapped source pages of lowered weights that view
    it). Folding each pair as soon as it is made keeps one copy at a time.
    """
    const_op = var.op
    casts = list(var.child_ops)
    if not casts or any(c.op_type != "cast" or c.outputs[0].val is None or c.outputs[0].dtype != types.fp16
                        for c in casts):
        return 0  # a reader not cast yet (or kept in fp32) still needs the fp32 value
    if var in const_op.enclosing_block.outputs:
        return 0
    block = const_op.enclosing_block
    for cast in casts:
        out = cast.outputs[0]
        folded = mb.const(val=out.val, name=out.name, before_op=cast)
        block.replace_uses_of_var_after_op(anchor_op=cast, old_var=out, new_var=folded)
        block.remove_ops([cast])
    value = var.val
    # A view of a mapped weight file holds no memory once its pages are dropped (below): only
    # values of the process's own count towards the next collection.
    freed = 0 if views_read_only_mmap(value) else int(np.asarray(value).nbytes)
    block.remove_ops([const_op])
    # The cast pass iterates over a list of every op it started with, removed ones included, so
    # the removed const would keep its fp32 value alive until the pass ends: let go of it here.
    var._sym_val = None
    for inner in const_op._input_vars.values():
        if isinstance(inner, Var):
            inner._sym_val = None
    drop_mapped_pages([value])  # a lowered weight viewing its mapped initializer: read once, done
    return freed


@register_pass(namespace="edgebuild")
class drop_weight_pages(AbstractGraphPass):  # noqa: N801 - coremltools names a pass after its class
    """Drops the resident pages of constants that view a mapped weight file, after a pass that read
    them all (``const_deduplication`` flattens each weight to hash it, which reads a transposed
    view in full); they are read again only where a later pass needs them."""

    def apply(self, prog):
        values = [op.outputs[0].val for function in prog.functions.values() for op in function.operations
                  if op.op_type == "const"]
        drop_mapped_pages(values)


@register_pass(namespace="edgebuild")
class collect_garbage(AbstractGraphPass):  # noqa: N801 - coremltools names a pass after its class
    """Frees the constants earlier passes replaced (the fp32 originals of fp16 weights): pymil
    graphs are cyclic, so without a collection they stay resident while the program is serialized."""

    def apply(self, prog):
        gc.collect()


def pass_pipeline(precision: str, *, keep_fp32: Iterable[str] | None = None, before_cast: Callable | None = None,
                  passes: str = "lowering") -> ct.PassPipeline:
    """The main pipeline for ``ct.convert``: ``passes`` is ``"lowering"`` (:func:`lowering_passes`)
    or ``"default"`` (coremltools' own). Under float16 the cast pass is :class:`guarded_fp16_cast`
    with ``keep_fp32`` / ``before_cast``, and a garbage collection follows the last pass."""
    if passes not in PIPELINES:
        raise ValueError(f"unknown pass list {passes!r}; one of {', '.join(PIPELINES)}")
    if passes == "default":
        names = list(ct.PassPipeline.DEFAULT.passes)
        if precision != "float16":
            names = [n for n in names if n not in (FP16_CAST_PASS, "common::add_int16_cast")]
    else:
        names = lowering_passes(precision)
    if precision == "float16":
        names = [GUARDED_FP16_CAST_PASS if n == FP16_CAST_PASS else n for n in names] + [COLLECT_GARBAGE_PASS]
    pipeline = ct.PassPipeline(names, pipeline_name=f"edgebuild_{passes}")
    if precision == "float16":
        pipeline.set_options(GUARDED_FP16_CAST_PASS,
                             {"keep_fp32": frozenset(keep_fp32 or ()), "before_cast": before_cast})
    return pipeline


def _skip_validation(check_essential_scope: bool = False) -> None:
    """Stands in for ``Program.validate`` between passes."""


@contextmanager
def validated_once(program):
    """Run coremltools' pipelines on ``program`` with one validation, at the end, instead of one
    after every pass (a third of the pipeline's time on a conv net).

    ``PassPipelineManager`` calls ``prog.validate()`` after each pass; an attribute on this one
    program shadows the method meanwhile, so nothing else in the process is affected. The final
    check is the strictest one coremltools runs (after dead-code elimination, with scopes).
    """
    program.validate = _skip_validation
    try:
        yield program
    finally:
        del program.validate
    program.validate(check_essential_scope=True)
