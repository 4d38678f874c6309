"""Palettise an .mlpackage as an edit of its protobuf and weight file, without a MIL program.

For a plain k-means palettisation (one global config, nothing combined) the only change to the
package is: some ``const`` ops become ``constexpr_lut_to_dense`` ops, and the weight file holds
their tables and indices instead of their values. Reading the program through coremltools'
loader and writing it back through its serializer costs several times the clustering itself, so
this module parses ``model.mlmodel``, reads the selected weights from ``weight.bin``, clusters
them with the same k-means and weight-selection rules as :mod:`.fast_palettize`, and writes a
new weight file (untouched values copied, in program order) and the edited protobuf.

The ops it emits are the ones :mod:`.fast_palettize` emits: the iOS18 form (uint<n> indices
shaped like the weight, one table per channel group, operands as inputs) for opsets from
CoreML8, otherwise the iOS16 form (bit-packed uint8 indices, one table, an explicit shape,
operands as attributes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from coremltools.proto import MIL_pb2, Model_pb2

from edgebuild.plugin import BuildError

from . import blob_file
from .config import PalettizeWeights
from .fast_palettize import PaletteJob, cluster_jobs
from .spec_program import iter_block_ops, main_blocks, op_name, tensor_shape, weight_uses_from_spec

_DT = MIL_pb2.DataType
_WEIGHT_FILE = "@model_path/weights/weight.bin"
_SPEC = Path("Data") / "com.apple.CoreML" / "model.mlmodel"
_WEIGHTS = Path("Data") / "com.apple.CoreML" / "weights" / "weight.bin"
_INDEX_TYPE = {1: _DT.UINT1, 2: _DT.UINT2, 3: _DT.UINT3, 4: _DT.UINT4, 6: _DT.UINT6, 8: _DT.UINT8}


class NotEditable(Exception):
    """The package is outside what this path handles; compress it through the MIL program."""


@dataclass
class _Site:
    """Where a weight to palettise lives: its op in the protobuf and the program's opset."""

    op: MIL_pb2.Operation
    opset_version: int


def palettize_package(
    src: Path, dst: Path, weights: PalettizeWeights, *, weight_threshold: int, workers: int | None = None,
) -> tuple[dict, dict]:
    """Palettise ``src`` into ``dst`` (atomically) as ``weights`` (scalar k-means) says; returns
    the weight uses before and after.

    Weights of more than ``weight_threshold`` elements are compressed. Raises
    :class:`NotEditable` (before writing anything) for packages this path does not handle.
    """
    nbits = weights.nbits
    group_size = weights.group_size if weights.granularity == "per_grouped_channel" else 0  # 0: one table
    src, dst = Path(src), Path(dst)
    model = _read_spec(src)
    program = model.mlProgram
    before = weight_uses_from_spec(program)
    try:
        reader = blob_file.BlobReader(src / _WEIGHTS)
        for function in program.functions.values():
            for block in function.block_specializations.values():
                for value in _blob_values(block):
                    reader.record(value.blobFileValue.offset)  # raises before anything is written
        jobs = _find_jobs(program, reader, nbits, group_size, weight_threshold)
    except blob_file.BadBlob as error:
        raise NotEditable(f"{src}: {error}") from error
    cluster_jobs(jobs, workers=workers, packed=True)

    write_edited_package(src, dst, model, lambda weights: _rewrite(program, jobs, reader, weights))
    return before, weight_uses_from_spec(program)


def write_edited_package(src: Path, dst: Path, model, write_weights) -> None:
    """``dst``: a copy of the package ``src`` with a new weight file (``write_weights(path)``) and
    the edited ``model`` spec, staged beside ``dst`` and swapped in whole."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        written = staging / dst.name
        shutil.copytree(src, written, ignore=_skip_rewritten(src))
        (written / _WEIGHTS).parent.mkdir(parents=True, exist_ok=True)
        write_weights(written / _WEIGHTS)
        (written / _SPEC).write_bytes(model.SerializeToString())
        if dst.exists():
            os.replace(dst, staging / "previous")
        os.replace(written, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _read_spec(src: Path) -> Model_pb2.Model:
    if not (src / _SPEC).is_file() or not (src / _WEIGHTS).is_file():
        raise NotEditable(f"{src}: not an ML program package with a weight file")
    model = Model_pb2.Model()
    model.ParseFromString((src / _SPEC).read_bytes())
    if model.WhichOneof("Type") != "mlProgram":
        raise NotEditable(f"{src}: not an ML program")
    for function in model.mlProgram.functions.values():
        for block in function.block_specializations.values():
            for value in _blob_values(block):
                fv = value.blobFileValue
                if fv.fileName != _WEIGHT_FILE:
                    raise NotEditable(f"{src}: weight {fv.fileName}@{fv.offset} of an unexpected kind")
    return model


def _skip_rewritten(src: Path):
    rewritten = {(src / _SPEC).resolve(), (src / _WEIGHTS).resolve()}

    def ignore(directory, names):
        return [n for n in names if (Path(directory) / n).resolve() in rewritten]

    return ignore


def _find_jobs(program, reader, nbits: int, group_size: int, weight_threshold: int) -> list[PaletteJob]:
    """The const ops coremltools' palettiser would compress under one global config."""
    jobs = []
    for opset, block in main_blocks(program):
        opset_version = _opset_version(opset)
        consumers, block_outputs = _consumers(block)
        consts = {op.outputs[0].name: op for op in iter_block_ops(block) if op.type == "const"}
        for op in consts.values():
            value = op.attributes["val"] if "val" in op.attributes else None
            if value is None or not value.HasField("blobFileValue"):
                continue
            data_type = value.type.tensorType.dataType
            shape = tensor_shape(value.type)
            size = int(np.prod(shape)) if shape else 1
            if data_type not in (_DT.FLOAT16, _DT.FLOAT32) or len(shape) < 2:
                continue
            if size < 10 or size <= weight_threshold:
                continue
            var = op.outputs[0].name
            uses = consumers.get(var, [])
            if not uses or var in block_outputs or any(u.type.startswith("constexpr_") for u, _ in uses):
                continue
            axis = _output_channel_axis(var, uses, len(shape), consts)
            if axis is None:
                continue  # coremltools skips weights whose channel axis it cannot tell
            if group_size and shape[axis] % group_size:
                continue
            if group_size and opset_version < 8:
                raise BuildError(
                    f"{op_name(op)}: per-grouped-channel palettisation needs an iOS18 program",
                    hint="raise target.deployment_target to iOS18 or use granularity per_tensor",
                )
            flat = reader.array(data_type, value.blobFileValue.offset)
            jobs.append(PaletteJob(_Site(op, opset_version), flat.reshape(shape), nbits, axis, group_size))
    return jobs


def _opset_version(opset: str) -> int:
    digits = opset.removeprefix("CoreML")
    if not digits.isdigit():
        raise NotEditable(f"unknown opset {opset!r}")
    return int(digits)


def _consumers(block):
    """Var name -> [(op, input name)] reading it, and the names any block returns."""
    consumers: dict[str, list] = {}
    outputs: set[str] = set(block.outputs)
    for op in iter_block_ops(block):
        for inner in op.blocks:
            outputs.update(inner.outputs)
        for input_name, argument in op.inputs.items():
            for binding in argument.arguments:
                if binding.name:
                    consumers.setdefault(binding.name, []).append((op, input_name))
    return consumers, outputs


def _output_channel_axis(var: str, uses, rank: int, consts: dict) -> int | None:
    """coremltools' rule: 0, or 1 under conv_transpose, or by matmul's side and transpose flag."""
    axes = set()
    for op, input_name in uses:
        axis = 0
        if op.type == "conv_transpose":
            axis = 1
        elif op.type == "matmul":
            if input_name == "y":
                axis = -2 if _bool_input(op, "transpose_y", consts) else -1
            else:
                axis = -1 if _bool_input(op, "transpose_x", consts) else -2
        axes.add(axis + rank if axis < 0 else axis)
    return axes.pop() if len(axes) == 1 else None


def _bool_input(op, input_name: str, consts: dict) -> bool:
    if input_name not in op.inputs:
        return False
    binding = op.inputs[input_name].arguments[0]
    value = binding.value if binding.HasField("value") else consts[binding.name].attributes["val"]
    return bool(value.immediateValue.tensor.bools.values[0])


def _rewrite(program, jobs: list[PaletteJob], reader, weights_path: Path) -> None:
    """Write the new weight file in program order and turn each job's const into a LUT op."""
    by_op = {id(job.op.op): job for job in jobs}
    renamed: dict[str, str] = {}
    copied: dict[int, int] = {}  # old offset -> new offset (one blob may back several values)
    with blob_file.BlobWriter(weights_path) as writer:
        for function in program.functions.values():
            for block in function.block_specializations.values():
                for op in iter_block_ops(block):
                    job = by_op.get(id(op))
                    if job is not None:
                        old_var = op.outputs[0].name
                        _to_lut_op(job, writer)
                        renamed[old_var] = op.outputs[0].name
                        continue
                    for value in _op_blob_values(op):
                        offset = value.blobFileValue.offset
                        if offset not in copied:
                            copied[offset] = writer.copy(reader, offset)
                        value.blobFileValue.offset = copied[offset]
    _rename_uses(program, renamed)


def _to_lut_op(job: PaletteJob, writer) -> None:
    """Replace the const in place by ``constexpr_lut_to_dense`` named ``<name>_palettized``."""
    op = job.op.op
    name = op_name(op) + "_palettized"
    output_type = MIL_pb2.ValueType()
    output_type.CopyFrom(op.outputs[0].type)
    lut_type = output_type.tensorType.dataType
    op.Clear()
    op.type = "constexpr_lut_to_dense"
    output = op.outputs.add()
    output.name = name
    output.type.CopyFrom(output_type)
    _set_string(op.attributes["name"], name)
    shape = job.value.shape
    if job.op.opset_version >= 8:
        index_type = _INDEX_TYPE[job.nbits]
        _set_blob(op.inputs["indices"].arguments.add().value, index_type, shape,
                  writer.write(index_type, job.packed, count=job.value.size))
        lut_shape = [1] * len(shape)
        lut_shape[job.channel_axis] = job.lut.shape[0]
        lut_shape += [1 << job.nbits, 1]
        _set_blob(op.inputs["lut"].arguments.add().value, lut_type, lut_shape,
                  writer.write(lut_type, job.lut))
    else:
        _set_blob(op.attributes["indices"], _DT.UINT8, [job.packed.size],
                  writer.write(_DT.UINT8, job.packed))
        _set_blob(op.attributes["lut"], lut_type, [1 << job.nbits],
                  writer.write(lut_type, job.lut[0]))
        shape_value = op.attributes["shape"]
        _set_tensor_type(shape_value.type, _DT.UINT32, [len(shape)])
        shape_value.immediateValue.tensor.bytes.values = np.array(shape, dtype=np.uint32).tobytes()


def _set_blob(value: MIL_pb2.Value, data_type: int, shape, offset: int) -> None:
    _set_tensor_type(value.type, data_type, shape)
    value.blobFileValue.fileName = _WEIGHT_FILE
    value.blobFileValue.offset = offset


def _set_tensor_type(value_type: MIL_pb2.ValueType, data_type: int, shape) -> None:
    tensor = value_type.tensorType
    tensor.dataType = data_type
    tensor.rank = len(shape)
    for dim in shape:
        tensor.dimensions.add().constant.size = int(dim)


def _set_string(value: MIL_pb2.Value, text: str) -> None:
    value.type.tensorType.dataType = _DT.STRING
    value.immediateValue.tensor.strings.values.append(text)


def _blob_values(block):
    for op in iter_block_ops(block):
        yield from _op_blob_values(op)


def _op_blob_values(op):
    """The values of ``op`` stored in the weight file (attributes and inline input values)."""
    for value in op.attributes.values():
        if value.HasField("blobFileValue"):
            yield value
    for argument in op.inputs.values():
        for binding in argument.arguments:
            if binding.HasField("value") and binding.value.HasField("blobFileValue"):
                yield binding.value


def _rename_uses(program, renamed: dict[str, str]) -> None:
    if not renamed:
        return
    for function in program.functions.values():
        for block in function.block_specializations.values():
            for op in iter_block_ops(block):
                for argument in op.inputs.values():
                    for binding in argument.arguments:
                        if binding.name in renamed:
                            binding.name = renamed[binding.name]
