"""Walking an ML program in its protobuf form (``Model.mlProgram``) without building a MIL program.

Reading a program through coremltools' milproto loader and writing it back costs far more than
palettising it; edits that only swap const ops need nothing more than the protobuf. The weight
sizes reported here follow :func:`.program.weight_uses` exactly, so reports do not depend on
which path compressed the model.
"""

from __future__ import annotations

from collections.abc import Iterator

from coremltools.proto import MIL_pb2

from .program import _MODE_OF_CONSTEXPR, WeightUse

_DT = MIL_pb2.DataType
FLOAT_TYPES = (_DT.FLOAT16, _DT.FLOAT32, _DT.FLOAT64, _DT.BFLOAT16)
_BITS = {
    _DT.BOOL: 1, _DT.FLOAT16: 16, _DT.BFLOAT16: 16, _DT.FLOAT32: 32, _DT.FLOAT64: 64,
    _DT.INT8: 8, _DT.INT16: 16, _DT.INT32: 32, _DT.INT64: 64, _DT.UINT8: 8, _DT.UINT16: 16,
    _DT.UINT32: 32, _DT.UINT64: 64, _DT.INT4: 4, _DT.UINT1: 1, _DT.UINT2: 2, _DT.UINT3: 3,
    _DT.UINT4: 4, _DT.UINT6: 6,
}


def main_blocks(program: MIL_pb2.Program) -> Iterator[tuple[str, MIL_pb2.Block]]:
    """(opset, block) of each function's specialisation that runs (the one the loader reads)."""
    for function in program.functions.values():
        yield function.opset, function.block_specializations[function.opset]


def iter_block_ops(block: MIL_pb2.Block) -> Iterator[MIL_pb2.Operation]:
    """Every op of ``block``, nested blocks included, in order."""
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from iter_block_ops(inner)


def op_name(op: MIL_pb2.Operation) -> str:
    if "name" in op.attributes:
        return op.attributes["name"].immediateValue.tensor.strings.values[0]
    return op.outputs[0].name


def is_weight_op(op: MIL_pb2.Operation) -> bool:
    return op.type == "const" or op.type.startswith("constexpr_")


def tensor_shape(value_type: MIL_pb2.ValueType) -> tuple[int, ...]:
    return tuple(int(d.constant.size) for d in value_type.tensorType.dimensions)


def value_bytes(value_type: MIL_pb2.ValueType) -> int:
    """Storage of a tensor of this type, rounded up to whole bytes (strings and such count 0)."""
    bits = _BITS.get(value_type.tensorType.dataType, 0)
    count = 1
    for dim in tensor_shape(value_type):
        count *= dim
    return (count * bits + 7) // 8


def producers(block: MIL_pb2.Block) -> dict[str, MIL_pb2.Operation]:
    """Output var name -> the weight op producing it, over ``block`` and its nested blocks."""
    return {
        output.name: op for op in iter_block_ops(block) if is_weight_op(op) for output in op.outputs
    }


def weight_uses_from_spec(program: MIL_pb2.Program, min_elements: int = 2) -> dict[str, WeightUse]:
    """Weight inputs of compute ops by "<op>.<input>", as :func:`.program.weight_uses` lists them."""
    uses: dict[str, WeightUse] = {}
    for _, block in main_blocks(program):
        by_var = producers(block)
        for op in iter_block_ops(block):
            if is_weight_op(op):
                continue
            for input_name, argument in op.inputs.items():
                if len(argument.arguments) != 1:
                    continue  # a list of vars (concat's values): not a weight input
                binding = argument.arguments[0]
                if binding.HasField("value"):  # an inline literal is a const of its own
                    value_type, stored, modes = binding.value.type, value_bytes(binding.value.type), []
                elif binding.name in by_var:
                    producer = by_var[binding.name]
                    value_type = next(o.type for o in producer.outputs if o.name == binding.name)
                    stored, modes = _chain_storage(producer, by_var)
                else:
                    continue
                if value_type.tensorType.dataType not in FLOAT_TYPES:
                    continue  # shapes, strides, pads: parameters, not weights
                shape = tensor_shape(value_type)
                if _count(shape) < min_elements:
                    continue
                key = f"{op_name(op)}.{input_name}"
                uses[key] = WeightUse(key, op.type, shape, stored, "+".join(modes) or "none")
    return uses


def _chain_storage(op: MIL_pb2.Operation, by_var: dict) -> tuple[int, list[str]]:
    """Bytes of every stored value feeding ``op`` and the compression modes on the way."""
    if op.type == "const":
        return value_bytes(op.outputs[0].type), []
    total, modes = 0, [_MODE_OF_CONSTEXPR.get(op.type, op.type)]
    # iOS16/17 constexpr ops keep their operands as attributes, iOS18 ones as inputs.
    for key, value in op.attributes.items():
        if key != "name":
            total += value_bytes(value.type)
    for argument in op.inputs.values():
        for binding in argument.arguments:
            if binding.HasField("value"):
                total += value_bytes(binding.value.type)
            elif binding.name in by_var:
                stored, inner = _chain_storage(by_var[binding.name], by_var)
                total += stored
                modes += [m for m in inner if m not in modes]
    return total, modes


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
