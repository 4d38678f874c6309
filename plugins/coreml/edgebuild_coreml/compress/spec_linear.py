"""Linear (int8/int4) weight quantisation of an iOS18 .mlpackage as an edit of its protobuf and
weight file, one tensor at a time.

coremltools' pass loads every weight of the program into memory, adds the quantised copies
beside them and serialises the lot; for a decoder of a billion parameters that is the fp16
model plus its compressed form plus the serialiser's buffers. Here each selected ``const``
is read as a view of the memory-mapped weight file, quantised and written to the new weight
file before the next one is read, so the working set is one tensor (and its float32 copy)
however large the model. Every other blob is copied through from the map.

The weights chosen, their block sizes and the arithmetic follow coremltools' linear quantiser
(``infer_block_sizes`` axes: 0/1, conv_transpose 1/0, matmul by side and transpose flag;
symmetric ranges ``[-(2^(n-1)-1), 2^(n-1)-1]``), and the ops written are the ones it writes
from iOS18 on: ``constexpr_blockwise_shift_scale`` named ``<const>_quantized``, data shaped
like the weight (int4/uint4 packed two per byte, low nibble first), a scale of the same rank
with one entry per block, and an offset unless the mode is signed symmetric. Anything outside
that (an older opset, a const whose consumers disagree on its channel axis) raises
:class:`~.spec_palettize.NotEditable` before a byte is written, and the caller falls back to
coremltools' pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from coremltools.proto import MIL_pb2

from edgebuild_coreml.memory import freed_blocks_kept

from . import blob_file
from .config import CompressionSection, LinearWeights
from .packing import pack_indices
from .spec_palettize import (
    _WEIGHTS,
    NotEditable,
    _blob_values,
    _bool_input,
    _consumers,
    _op_blob_values,
    _opset_version,
    _read_spec,
    _rename_uses,
    _set_blob,
    _set_string,
    write_edited_package,
)
from .spec_program import iter_block_ops, main_blocks, op_name, tensor_shape, weight_uses_from_spec

_DT = MIL_pb2.DataType
_DATA_TYPE = {"int8": _DT.INT8, "uint8": _DT.UINT8, "int4": _DT.INT4, "uint4": _DT.UINT4}
_NUMPY_FLOAT = {_DT.FLOAT16: np.float16, _DT.FLOAT32: np.float32}


def handles_section(section: CompressionSection) -> bool:
    """Whether this path applies: every mode the section names is linear (or none), nothing else."""
    configs = [section.weights] + [override.weights for override in section.overrides]
    return (
        section.activations is None
        and section.auto is None
        and any(isinstance(c, LinearWeights) for c in configs)
        and all(c is None or isinstance(c, LinearWeights) for c in configs)
    )


@dataclass
class _Job:
    op: MIL_pb2.Operation
    config: LinearWeights
    data_type: int  # of the float weight
    shape: tuple[int, ...]
    offset: int  # of its blob
    block_sizes: list[int]


def quantize_package(src: Path, dst: Path, section: CompressionSection | Mapping[str, LinearWeights], *,
                     weight_threshold: int) -> tuple[dict, dict]:
    """Quantise ``src`` into ``dst`` (atomically) as the linear-only ``section`` says, or as a mapping
    of const op names to their configs (auto mode's per-layer choices); returns the weight uses
    before and after. Weights of more than ``weight_threshold`` elements are compressed."""
    src, dst = Path(src), Path(dst)
    model = _read_spec(src)
    program = model.mlProgram
    before = weight_uses_from_spec(program)
    try:
        reader = blob_file.BlobReader(src / _WEIGHTS)
        for function in program.functions.values():
            for block in function.block_specializations.values():
                for value in _blob_values(block):
                    reader.record(value.blobFileValue.offset)
        jobs = _find_jobs(program, section, weight_threshold)
    except blob_file.BadBlob as error:
        raise NotEditable(f"{src}: {error}") from error

    with freed_blocks_kept():  # each tensor's temporaries reuse the last one's memory
        write_edited_package(src, dst, model, lambda weights: _rewrite(program, jobs, reader, weights))
    return before, weight_uses_from_spec(program)


# -- which consts, with which config -----------------------------------------------------------


def _find_jobs(program, section, weight_threshold: int) -> list[_Job]:
    jobs = []
    for opset, block in main_blocks(program):
        if _opset_version(opset) < 8:
            raise NotEditable("constexpr_blockwise_shift_scale needs an iOS18 program")
        consumers, block_outputs = _consumers(block)
        consts = {op.outputs[0].name: op for op in iter_block_ops(block) if op.type == "const"}
        for var, op in consts.items():
            value = op.attributes["val"] if "val" in op.attributes else None
            if value is None or not value.HasField("blobFileValue"):
                continue  # small values live inline; coremltools leaves them too
            data_type = value.type.tensorType.dataType
            shape = tensor_shape(value.type)
            size = int(np.prod(shape)) if shape else 1
            if data_type not in _NUMPY_FLOAT or size <= weight_threshold:
                continue
            uses = consumers.get(var, [])
            if not uses or var in block_outputs:
                continue
            if any(u.type.startswith("constexpr_") for u, _ in uses):
                raise NotEditable(f"{op_name(op)} feeds another constexpr (joint compression)")
            if isinstance(section, CompressionSection):
                config = _config_for(section, uses)
            else:
                config = section.get(op_name(op))
            if config is None or len(shape) < 2:
                continue  # rank 1 would get a scale per element: larger than the weight
            axes = _channel_axes(uses, len(shape), consts)
            if axes is None:
                raise NotEditable(f"{op_name(op)}: its consumers disagree on its channel axis")
            block_sizes = _block_sizes(config, shape, *axes)
            if any(b and dim % b for dim, b in zip(shape, block_sizes)):
                continue  # coremltools skips a block size that does not divide the axis
            jobs.append(_Job(op, config, data_type, shape, value.blobFileValue.offset, block_sizes))
    return jobs


def _config_for(section: CompressionSection, uses) -> LinearWeights | None:
    """The config coremltools would give the const: each consumer's (override by op name, then by
    op type, then global, later overrides winning), which must agree."""
    configs = []
    for op, _ in uses:
        name = op_name(op)
        by_name = [o.weights for o in section.overrides
                   if o.match.name is not None and re.fullmatch(o.match.name, name) and o.match.op_type in (None, op.type)]
        by_type = [o.weights for o in section.overrides if o.match.name is None and o.match.op_type == op.type]
        configs.append((by_name or by_type or [section.weights])[-1])
    if any(c != configs[0] for c in configs):
        raise NotEditable("ops sharing a weight have different compression configs")
    return configs[0]


def _channel_axes(uses, rank: int, consts: dict) -> tuple[int, int] | None:
    """(output, input) channel axes by coremltools' rule, or None when consumers disagree."""
    found = set()
    for op, input_name in uses:
        out_axis, in_axis = 0, 1
        if op.type == "conv_transpose":
            out_axis, in_axis = 1, 0
        elif op.type == "matmul":
            if input_name == "y":
                flipped = _bool_input(op, "transpose_y", consts)
                out_axis, in_axis = (-2, -1) if flipped else (-1, -2)
            else:
                flipped = _bool_input(op, "transpose_x", consts)
                out_axis, in_axis = (-1, -2) if flipped else (-2, -1)
        found.add((out_axis % rank, in_axis % rank))
    return found.pop() if len(found) == 1 else None


def _block_sizes(config: LinearWeights, shape, out_axis: int, in_axis: int) -> list[int]:
    sizes = [0] * len(shape)
    if config.granularity == "per_channel":
        sizes[out_axis] = 1
    elif config.granularity == "per_block":
        sizes[out_axis] = 1
        sizes[in_axis] = config.block_size
    return sizes


# -- the arithmetic ---------------------------------------------------------------------------------


def quant_range(dtype: str, symmetric: bool) -> tuple[int, int]:
    """The integer range coremltools quantises into (symmetric modes drop one code)."""
    bits = int(dtype.removeprefix("u").removeprefix("int"))
    if dtype.startswith("u"):
        return 0, (1 << bits) - (2 if symmetric else 1)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return (low + 1 if symmetric else low), high


SPLIT_ELEMENTS = 1 << 20  # a weight this large is quantised in slices of about this many elements
THREADS = 2


def quantize_blockwise(weight: np.ndarray, config: LinearWeights, block_sizes: list[int]):
    """(integer data shaped like ``weight``, scale, offset or None) with one scale per block.

    The scale is rounded to the weight's dtype first and the data quantised against that
    rounded scale, so dequantising what is stored gives the nearest representable values.
    A large weight with an axis of one channel per block (per-channel and per-block modes) is
    quantised in slices along it, on two threads (numpy releases the GIL): the float32 working
    copy is a slice's, not the whole weight's.
    """
    axis = next((i for i, b in enumerate(block_sizes) if b == 1 and weight.shape[i] > 1), None)
    if axis is None or weight.size <= SPLIT_ELEMENTS:
        return _quantize_blockwise(weight, config, block_sizes)
    step = max(1, weight.shape[axis] * SPLIT_ELEMENTS // weight.size)
    slices = [weight[(slice(None),) * axis + (slice(start, start + step),)]
              for start in range(0, weight.shape[axis], step)]
    with ThreadPoolExecutor(THREADS) as pool:
        parts = list(pool.map(lambda part: _quantize_blockwise(part, config, block_sizes), slices))
    data = np.concatenate([p[0] for p in parts], axis=axis)
    scale = np.concatenate([p[1] for p in parts], axis=axis)
    offset = None if parts[0][2] is None else np.concatenate([p[2] for p in parts], axis=axis)
    return data, scale, offset


def _quantize_blockwise(weight: np.ndarray, config: LinearWeights, block_sizes: list[int]):
    blocked_shape, scale_shape, reduce_axes = [], [], []
    for dim, block in zip(weight.shape, block_sizes):
        if block:
            blocked_shape += [dim // block, block]
            scale_shape.append(dim // block)
            reduce_axes.append(len(blocked_shape) - 1)
        else:
            blocked_shape.append(dim)
            scale_shape.append(1)
            reduce_axes.append(len(blocked_shape) - 1)
    low_q, high_q = quant_range(config.dtype, config.symmetric)
    offset = None
    if config.symmetric and weight.dtype == np.float16:
        # the bound straight from the fp16 weight, before any float32 copy is made
        values = None
        bound = half_block_magnitude(np.reshape(weight, blocked_shape), tuple(reduce_axes))
        low, high = -bound, bound
    else:
        values = np.array(weight, dtype=np.float32).reshape(blocked_shape)  # a copy: the map is read-only
        low = block_extreme(values, tuple(reduce_axes), np.minimum)
        high = block_extreme(values, tuple(reduce_axes), np.maximum)
    if values is not None and config.symmetric:
        bound = np.maximum(-low, high)
        low, high = -bound, bound
    elif not config.symmetric:
        low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
    scale = (high - low) / (high_q - low_q)
    scale = np.where(scale > 0, scale, 1.0).astype(weight.dtype).astype(np.float32)  # all-zero block: any scale
    if config.dtype.startswith("u") and config.symmetric:
        offset = np.full(scale.shape, (high_q + 1) // 2, dtype=np.float32)
    elif not config.symmetric:
        offset = np.clip(np.round(low_q - low / scale), low_q, high_q)
    if values is None:  # fp16 widened exactly inside the division: the float32 copy is its result
        data = np.divide(np.reshape(weight, blocked_shape), scale, dtype=np.float32)
    else:
        data = np.divide(values, scale, out=values)  # in place: one float32 copy of the tensor at a time
    np.round(data, out=data)
    if offset is not None:
        data += offset
    np.clip(data, low_q, high_q, out=data)
    int_type = np.uint8 if config.dtype.startswith("u") else np.int8
    data = data.astype(int_type).reshape(weight.shape)
    scale = scale.astype(weight.dtype).reshape(scale_shape)
    if offset is not None:
        offset = offset.astype(int_type).reshape(scale_shape)
    return data, scale, offset


def block_extreme(values: np.ndarray, axes: tuple[int, ...], op) -> np.ndarray:
    """``op.reduce`` of ``values`` over ``axes`` (kept as length 1), ``op`` np.minimum or np.maximum.

    numpy reduces a short innermost axis (a block of 32) an element at a time; folding it in
    halves first (the elementwise op on two half views, which numpy vectorises) leaves it a few
    elements to reduce: 1.5x faster here. The minimum and maximum are exact, so the order in
    which elements meet does not change them (nor a NaN, which either order propagates).
    """
    last = values.ndim - 1
    if last in axes:
        while values.shape[last] > 1 and values.shape[last] % 2 == 0:
            half = values.shape[last] // 2
            values = op(values[..., :half], values[..., half:])
    return op.reduce(values, axis=axes, keepdims=True)


def half_block_magnitude(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The largest ``|x|`` of each block of fp16 ``values`` over ``axes``, as float32 (kept dims).

    Below the sign bit, an fp16 value's bits order its magnitude as an unsigned integer (inf above
    every finite value, NaN above inf), so the block maxima are integer maxima over 16 bits, which
    numpy vectorises, instead of a minimum and a maximum over a float32 copy. Each equals
    ``max(-min, max)`` of the block exactly; a block holding a NaN gives a NaN, as that does.
    """
    magnitude = np.bitwise_and(values.view(np.uint16), 0x7FFF)
    return block_extreme(magnitude, axes, np.maximum).view(np.float16).astype(np.float32)


def stored_bytes(data: np.ndarray, dtype: str) -> np.ndarray:
    """The weight file's form of integer ``data``: int4/uint4 two per byte, low nibble first."""
    if dtype in ("int4", "uint4"):
        return pack_indices(np.asarray(data).view(np.uint8) & 0x0F, 4)
    return np.ascontiguousarray(data).view(np.uint8).reshape(-1)


# -- writing ------------------------------------------------------------------------------------


def _rewrite(program, jobs: list[_Job], reader, weights_path: Path) -> None:
    """Write the new weight file in program order, each job quantised as it is reached."""
    by_op = {id(job.op): job for job in jobs}
    renamed: dict[str, str] = {}
    copied: dict[int, int] = {}  # old offset -> new offset (one blob may back several values)
    with blob_file.BlobWriter(weights_path) as writer:
        for function in program.functions.values():
            for block in function.block_specializations.values():
                for op in iter_block_ops(block):
                    job = by_op.get(id(op))
                    if job is not None:
                        old_var = op.outputs[0].name
                        _to_shift_scale_op(job, reader, writer)
                        reader.drop_pages(job.offset)
                        renamed[old_var] = op.outputs[0].name
                        continue
                    for value in _op_blob_values(op):
                        offset = value.blobFileValue.offset
                        if offset not in copied:
                            copied[offset] = writer.copy(reader, offset)
                            reader.drop_pages(offset)
                        value.blobFileValue.offset = copied[offset]
    _rename_uses(program, renamed)


def _to_shift_scale_op(job: _Job, reader, writer) -> None:
    """Replace the const in place by ``constexpr_blockwise_shift_scale`` named ``<name>_quantized``."""
    weight = reader.array(job.data_type, job.offset).reshape(job.shape)  # a view of the map
    data, scale, offset = quantize_blockwise(weight, job.config, job.block_sizes)
    op = job.op
    name = op_name(op) + "_quantized"
    output_type = MIL_pb2.ValueType()
    output_type.CopyFrom(op.outputs[0].type)
    op.Clear()
    op.type = "constexpr_blockwise_shift_scale"
    output = op.outputs.add()
    output.name = name
    output.type.CopyFrom(output_type)
    _set_string(op.attributes["name"], name)
    int_type = _DATA_TYPE[job.config.dtype]
    _set_blob(op.inputs["data"].arguments.add().value, int_type, job.shape,
              writer.write(int_type, stored_bytes(data, job.config.dtype), count=data.size))
    _set_blob(op.inputs["scale"].arguments.add().value, job.data_type, scale.shape, writer.write(job.data_type, scale))
    if offset is not None:
        _set_blob(op.inputs["offset"].arguments.add().value, int_type, offset.shape,
                  writer.write(int_type, stored_bytes(offset, job.config.dtype), count=offset.size))
