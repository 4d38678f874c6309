"""The source evaluated in float64: the module's float32 arithmetic restated in double, run by JAX.

``validate.reference: float64`` holds an artifact to the exact answer rather than to JAX's own
float32 result, which is itself rounded. The module is rewritten through the MLIR bindings, not
as text: every float32 value (block arguments, op results, constants, function types) becomes
float64, so each op computes what it computed before, in double; float16 and bfloat16 parts stay
as the source wrote them, as the ONNX float64 evaluation leaves them. JAX runs the rewritten
module with 64-bit types enabled, on the CPU, as it runs the float32 one.

What has no float64 meaning is refused by name: a ``bitcast_convert`` of a float32 (its bits are
the point), an op whose attributes name float32 (a dot algorithm's precision types), and shapes
that are still symbolic.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from edgebuild.plugin import BuildError

# ops whose float32 operands or results mean their bits, not their values
BIT_EXACT_OPS = ("stablehlo.bitcast_convert",)
# ops whose attributes describe them (a composite's epsilon) while a body computes: never refused by them
METADATA_ATTRIBUTE_OPS = ("stablehlo.composite", "func.call")


def widened_portable(portable: bytes, *, origin: str, entry: str = "main") -> tuple[bytes, list, list]:
    """``portable`` (a StableHLO portable artifact) with float32 restated as float64, as a portable
    artifact, and the argument and result types of its function ``entry`` (else its ``main``, else
    its first public function) as ``(shape, numpy dtype)``."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    from edgebuild_jax.convert.types import source_dtype, tensor_shape
    from edgebuild_jax.mlir import new_context, parse_module

    context = new_context()
    module = parse_module(portable, context, origin=origin)
    with context, ir.Location.unknown():
        f32, f64 = ir.F32Type.get(), ir.F64Type.get()
        for op in _walk(module.body):
            _widen_op(op, f32, f64, origin)
        for op in module.body.operations:
            if op.operation.name == "func.func":
                _retype_function(op)
        if not module.operation.verify():
            raise BuildError(f"validate.reference: float64: {origin}: the module restated in float64 is not valid",
                             hint="use validate.reference: float32 (JAX on the source as it is)")
        block = _entry(module, entry).regions[0].blocks[0]
        arguments = [(tensor_shape(a.type), source_dtype(a.type)) for a in block.arguments]
        results = [(tensor_shape(v.type), source_dtype(v.type)) for v in list(block.operations)[-1].operands]
        widened = bytes(stablehlo.serialize_portable_artifact_str(str(module), stablehlo.get_current_version()))
    if any(None in shape for shape, _ in arguments + results):
        raise BuildError(f"validate.reference: float64: {origin} has symbolic shapes, which JAX runs only as the "
                         "export it is", hint="export the model for the recipe's shapes, or use validate.reference: float32")
    return widened, arguments, results


def _walk(block):
    """Every op of ``block`` and of the regions below it, parents first."""
    for op in block.operations:
        yield op
        for region in op.operation.regions:
            for inner in region.blocks:
                yield from _walk(inner)


def _ranked(value_type):
    """``value_type`` as a ranked tensor type, or None (a scalar, a token, a tuple)."""
    from jaxlib.mlir import ir

    try:
        return ir.RankedTensorType(value_type)
    except ValueError:
        return None


def _element(value_type):
    ranked = _ranked(value_type)
    return value_type if ranked is None else ranked.element_type


def _widened_type(value_type, f32, f64):
    from jaxlib.mlir import ir

    if value_type == f32:
        return f64
    ranked = _ranked(value_type)
    if ranked is not None and ranked.element_type == f32:
        return ir.RankedTensorType.get(ranked.shape, f64, ranked.encoding)
    return None


def _widen_op(op, f32, f64, origin: str) -> None:
    from jaxlib.mlir import ir

    operation = op.operation
    for region in operation.regions:
        for block in region.blocks:
            for argument in block.arguments:
                wide = _widened_type(argument.type, f32, f64)
                if wide is not None:
                    argument.set_type(wide)
    widened_results = False
    for result in operation.results:
        wide = _widened_type(result.type, f32, f64)
        if wide is not None:
            widened_results = True
            result.set_type(wide)
    involved = widened_results or _reads_float(operation, f64)
    if operation.name in BIT_EXACT_OPS and involved:
        raise _refused(operation, origin, "reinterprets float32 bits, which have no float64 meaning")
    if operation.name == "stablehlo.constant" and widened_results:
        value = operation.attributes["value"]
        array = np.asarray(ir.DenseElementsAttr(value)).astype(np.float64)
        operation.attributes["value"] = ir.DenseElementsAttr.get(array, type=operation.results[0].type)
    elif involved and operation.name not in METADATA_ATTRIBUTE_OPS:
        for name in operation.attributes:
            if "f32" in str(operation.attributes[name]):
                raise _refused(operation, origin, f"its attribute {name} names float32")


def _reads_float(operation, f64) -> bool:
    return any(_element(operand.type) == f64 for operand in operation.operands)


def _retype_function(function) -> None:
    """A ``func.func``'s type from its (widened) arguments and what it returns."""
    from jaxlib.mlir import ir

    blocks = list(function.regions[0].blocks)
    if not blocks:
        return
    returned = list(blocks[0].operations)[-1].operands
    function_type = ir.FunctionType.get([a.type for a in blocks[0].arguments], [v.type for v in returned])
    function.operation.attributes["function_type"] = ir.TypeAttr.get(function_type)


def _entry(module, name: str):
    functions = [op for op in module.body.operations if op.operation.name == "func.func"]
    named = {str(f.operation.attributes["sym_name"]).strip('"'): f for f in functions}
    public = [f for f in functions if "sym_visibility" not in f.operation.attributes
              or str(f.operation.attributes["sym_visibility"]).strip('"') == "public"]
    return named.get(name) or named.get("main") or (public or functions)[0]


def _refused(operation, origin: str, why: str) -> BuildError:
    location = str(operation.location)
    return BuildError(f"validate.reference: float64: {origin}: {operation.name} ({location}) {why}",
                      hint="use validate.reference: float32 (JAX on the source as it is)")


def float64_runner(portable: bytes, *, origin: str, input_names: Sequence[str], output_names: Sequence[str],
                   params=None, entry: str = "main") -> tuple[Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]], str]:
    """A runner of the module in float64 (JAX, CPU, x64 on) that takes the feeds validation makes,
    float32 ones widened exactly, and returns float64 outputs; and the evaluator's name.
    ``params``: a JAX function's parameters, its leading arguments, widened likewise."""
    import jax
    from jax import export as jax_export

    widened, arguments, results = widened_portable(portable, origin=origin, entry=entry)
    with jax.enable_x64(True):
        in_avals = tuple(jax.core.ShapedArray(tuple(shape), dtype) for shape, dtype in arguments)
        out_avals = tuple(jax.core.ShapedArray(tuple(shape), dtype) for shape, dtype in results)
    n_in, n_out = len(in_avals), len(out_avals)
    exported = jax_export.Exported(
        fun_name=entry, in_tree=jax.tree_util.tree_structure((tuple(range(n_in)), {})), in_avals=in_avals,
        out_tree=jax.tree_util.tree_structure(tuple(range(n_out))), out_avals=out_avals,
        _has_named_shardings=False, _in_named_shardings=(None,) * n_in, _out_named_shardings=(None,) * n_out,
        in_shardings_hlo=(None,) * n_in, out_shardings_hlo=(None,) * n_out, nr_devices=1, platforms=("cpu",),
        ordered_effects=(), unordered_effects=(), disabled_safety_checks=(), mlir_module_serialized=widened,
        calling_convention_version=jax_export.maximum_supported_calling_convention_version,
        module_kept_var_idx=tuple(range(n_in)), uses_global_constants=False, _get_vjp=None)
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(params)] if params is not None else []
    dtypes = [dtype for _, dtype in arguments]
    prefix = [leaf.astype(dtype) for leaf, dtype in zip(leaves, dtypes)]
    feeds = list(zip(input_names, dtypes[len(leaves):]))

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
            arrays = [np.asarray(inputs[name]).astype(dtype) for name, dtype in feeds]
            values = jax.tree_util.tree_leaves(exported.call(*prefix, *arrays))
        return {name: _compared_as(np.asarray(value)) for name, value in zip(output_names, values)}

    return run, "JAX, x64"


def _compared_as(value: np.ndarray) -> np.ndarray:
    """bfloat16 results as float64, which metrics read (float16 ones are numpy's own type)."""
    return value.astype(np.float64) if value.dtype.name == "bfloat16" else value
