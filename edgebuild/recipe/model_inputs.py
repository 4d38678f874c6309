"""The graph inputs of an ONNX file, read without loading its weights.

``onnx.load`` parses the whole protobuf, embedded weights included (up to 2 GB), to answer
what a recipe check needs: input names, element types and dims. This walks the protobuf wire
format over an mmap instead, skipping every field but ``graph.input`` and the initializers'
names, so checking a recipe against a large model reads a few kilobytes.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

# field numbers from onnx.proto
MODEL_GRAPH = 7
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_SPARSE_INITIALIZER = 5, 11, 15
TENSOR_NAME = 8
SPARSE_VALUES = 1


class NotOnnx(ValueError):
    """The bytes are not an ONNX model."""


@dataclass(frozen=True)
class GraphInput:
    name: str
    dtype: str | None  # numpy name (float32, int64, ...); None when the model does not say
    dims: list[int | str | None] | None  # None: rank unknown; a dim is an int, a symbol, or None
    initializer: bool = False  # also an initializer (a default value a caller may override)


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise NotOnnx("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, start, end) of each length-delimited field in ``buf[start:end]``."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise NotOnnx("field runs past the end of its message")
            yield field, pos, pos + length
            pos += length
        else:
            raise NotOnnx(f"unexpected wire type {wire}")
        if pos > end:
            raise NotOnnx("field runs past the end of its message")


def _name_of(buf, start: int, end: int, field: int = TENSOR_NAME) -> str | None:
    for number, s, e in _fields(buf, start, end):
        if number == field:
            return bytes(buf[s:e]).decode("utf-8", "replace")
    return None


def read_graph_inputs(path: Path) -> list[GraphInput]:
    """Every graph input, in order. Raises NotOnnx."""
    import onnx

    with open(path, "rb") as handle:
        if not handle.seek(0, 2):
            raise NotOnnx("empty file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graph = [(s, e) for number, s, e in _fields(buf, 0, len(buf)) if number == MODEL_GRAPH]
            if not graph:
                raise NotOnnx("no graph")
            raw_inputs, initializers = [], set()
            for number, s, e in _fields(buf, *graph[-1]):
                if number == GRAPH_INPUT:
                    raw_inputs.append(bytes(buf[s:e]))
                elif number == GRAPH_INITIALIZER:
                    initializers.add(_name_of(buf, s, e))
                elif number == GRAPH_SPARSE_INITIALIZER:
                    values = [(vs, ve) for n, vs, ve in _fields(buf, s, e) if n == SPARSE_VALUES]
                    if values:
                        initializers.add(_name_of(buf, *values[0]))
    result = []
    for raw in raw_inputs:
        try:
            info = onnx.ValueInfoProto.FromString(raw)
        except Exception as exc:  # protobuf's DecodeError
            raise NotOnnx(f"unreadable graph input ({exc})") from None
        tensor = info.type.tensor_type
        dtype = None
        if tensor.elem_type:
            try:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
            except Exception:  # an element type numpy has no name for (bfloat16, float8...)
                dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
        dims = None
        if tensor.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        result.append(GraphInput(info.name, dtype, dims, info.name in initializers))
    return result
