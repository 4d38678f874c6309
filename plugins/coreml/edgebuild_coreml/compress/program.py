"""Reading an .mlpackage back as a MIL program, and listing its weights and their sizes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import coremltools as ct
from coremltools.converters.mil.frontend.milproto.load import load as load_milproto
from coremltools.converters.mil.mil import types
from coremltools.models.utils import _convert_model_spec_to_pymil_prog

# What each decompression op says about how its weight was compressed.
_MODE_OF_CONSTEXPR = {
    "constexpr_lut_to_dense": "palettize",
    "constexpr_lut_to_sparse": "palettize",
    "constexpr_affine_dequantize": "linear",
    "constexpr_blockwise_shift_scale": "linear",
    "constexpr_sparse_to_dense": "prune",
    "constexpr_sparse_blockwise_shift_scale": "linear",
}


def load_program(model: ct.models.MLModel):
    """The MIL program of a saved model (``MLModel._mil_program`` is only set for fresh ones)."""
    if model._mil_program is not None:
        return model._mil_program
    spec_version = model.get_spec().specificationVersion
    return _convert_model_spec_to_pymil_prog(model, spec_version, load_milproto)


def iter_ops(program) -> Iterator:
    """Every op of every function, nested blocks included."""

    def walk(block):
        for op in block.operations:
            yield op
            for inner in op.blocks:
                yield from walk(inner)

    for function in program.functions.values():
        yield from walk(function)


def is_weight_op(op) -> bool:
    return op.op_type == "const" or op.op_type.startswith("constexpr_")


@dataclass(frozen=True)
class WeightUse:
    """One weight input of a compute op, with what storing it costs."""

    name: str  # "<op name>.<input name>"
    op_type: str
    shape: tuple[int, ...]
    bytes: int
    mode: str  # "none", or the compression modes joined by "+" (e.g. "prune+palettize")

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "shape": list(self.shape),
            "bytes": self.bytes,
            "mode": self.mode,
        }


def weight_uses(program, min_elements: int = 2) -> dict[str, WeightUse]:
    """Weight inputs of compute ops (const or constexpr chains) by "<op>.<input>" name."""
    uses: dict[str, WeightUse] = {}
    for op in iter_ops(program):
        if is_weight_op(op):
            continue
        for input_name, var in op.inputs.items():
            if isinstance(var, (list, tuple)) or var.op is None or not is_weight_op(var.op):
                continue
            if not types.is_float(var.dtype):  # shapes, strides, pads: parameters, not weights
                continue
            shape = tuple(int(d) for d in var.shape)
            if _element_count(shape) < min_elements:
                continue
            stored, modes = _chain_storage(var.op)
            mode = "+".join(modes) if modes else "none"
            key = f"{op.name}.{input_name}"
            uses[key] = WeightUse(key, op.op_type, shape, stored, mode)
    return uses


def _chain_storage(op) -> tuple[int, list[str]]:
    """Bytes of all consts feeding ``op`` and the compression modes on the way, outermost first."""
    if op.op_type == "const":
        return _var_bytes(op.outputs[0]), []
    total, modes = 0, [_MODE_OF_CONSTEXPR.get(op.op_type, op.op_type)]
    for var in op.inputs.values():
        if var.op is not None and is_weight_op(var.op):
            stored, inner = _chain_storage(var.op)
            total += stored
            modes += [m for m in inner if m not in modes]
    return total, modes


def _var_bytes(var) -> int:
    dtype = var.dtype
    bits = 1 if dtype == types.bool else dtype.get_bitwidth()
    return (_element_count(tuple(var.shape)) * bits + 7) // 8


def _element_count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count
