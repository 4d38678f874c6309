"""The graph inputs of an ONNX file, read without loading its weights.

``onnx.load`` parses the whole protobuf, embedded weights included (up to 2 GB), to answer
what a recipe check needs: input names, element types and dims. This walks the protobuf wire
format over an mmap instead, skipping every field but ``graph.input`` and the initializers'
names, so checking a recipe against a large model reads a few kilobytes — and imports no
onnx or numpy, which a fully cached run never loads.
"""

from __future__ import annotations

import mmap
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# field numbers from onnx.proto
MODEL_GRAPH = 7
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_SPARSE_INITIALIZER = 5, 11, 12, 15
TENSOR_NAME = 8
SPARSE_VALUES = 1
VALUE_INFO_NAME, VALUE_INFO_TYPE = 1, 2
TYPE_TENSOR = 1
TENSOR_TYPE_ELEM, TENSOR_TYPE_SHAPE = 1, 2
SHAPE_DIM = 1
DIM_VALUE, DIM_PARAM = 1, 2

# TensorProto.DataType -> numpy's name (onnx.helper.tensor_dtype_to_np_dtype, without importing onnx)
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
              9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
              15: "complex128", 16: "bfloat16"}


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


def _fields(buf, start: int, end: int, *, varints: bool = False):
    """(field number, start, end) of each length-delimited field in ``buf[start:end]``; with
    ``varints``, also (field number, value, None) for each varint field."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            if varints:
                yield field, value, None
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


def _text(buf, start: int, end: int) -> str:
    return bytes(buf[start:end]).decode("utf-8", "replace")


def _name_of(buf, start: int, end: int, field: int = TENSOR_NAME) -> str | None:
    for number, s, e in _fields(buf, start, end):
        if number == field:
            return _text(buf, s, e)
    return None


@contextmanager
def _graph_fields(path: Path):
    """The (field number, start, end) of the model's graph message, read from a memory map. Raises NotOnnx."""
    with open(path, "rb") as handle:
        if not handle.seek(0, 2):
            raise NotOnnx("empty file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            graph = [(s, e) for number, s, e in _fields(buf, 0, len(buf)) if number == MODEL_GRAPH]
            if not graph:
                raise NotOnnx("no graph")
            yield buf, _fields(buf, *graph[-1])


def read_graph_inputs(path: Path) -> list[GraphInput]:
    """Every graph input, in order. Raises NotOnnx."""
    with _graph_fields(path) as (buf, fields):
        inputs, initializers = [], set()
        for number, s, e in fields:
            if number == GRAPH_INPUT:
                inputs.append(_value_info(buf, s, e))
            elif number == GRAPH_INITIALIZER:
                initializers.add(_name_of(buf, s, e))
            elif number == GRAPH_SPARSE_INITIALIZER:
                values = [(vs, ve) for n, vs, ve in _fields(buf, s, e) if n == SPARSE_VALUES]
                if values:
                    initializers.add(_name_of(buf, *values[0]))
    return [GraphInput(name, dtype, dims, name in initializers) for name, dtype, dims in inputs]


def read_graph_outputs(path: Path) -> list[str]:
    """The names of the graph outputs, in order. Raises NotOnnx."""
    with _graph_fields(path) as (buf, fields):
        return [_value_info(buf, s, e)[0] for number, s, e in fields if number == GRAPH_OUTPUT]


def _value_info(buf, start: int, end: int) -> tuple[str, str | None, list | None]:
    """(name, dtype, dims) of a ValueInfoProto; dtype and dims are None when the model does not say."""
    name, dtype, dims = None, None, None
    for number, s, e in _fields(buf, start, end):
        if number == VALUE_INFO_NAME:
            name = _text(buf, s, e)
        elif number == VALUE_INFO_TYPE:
            for kind, ts, te in _fields(buf, s, e):
                if kind == TYPE_TENSOR:
                    dtype, dims = _tensor_type(buf, ts, te)
    if name is None:
        raise NotOnnx("a graph input has no name")
    return name, dtype, dims


def _tensor_type(buf, start: int, end: int) -> tuple[str | None, list | None]:
    dtype, dims = None, None
    for number, a, b in _fields(buf, start, end, varints=True):
        if number == TENSOR_TYPE_ELEM and b is None and a:
            dtype = ELEM_TYPES.get(a, f"onnx type {a}")
        elif number == TENSOR_TYPE_SHAPE and b is not None:
            dims = [_dim(buf, s, e) for n, s, e in _fields(buf, a, b) if n == SHAPE_DIM]
    return dtype, dims


def _dim(buf, start: int, end: int) -> int | str | None:
    for number, a, b in _fields(buf, start, end, varints=True):
        if number == DIM_VALUE and b is None:
            return a - (1 << 64) if a >= 1 << 63 else a  # int64: Paddle writes -1 for a dynamic dim
        if number == DIM_PARAM and b is not None:
            return _text(buf, a, b) or None
    return None
