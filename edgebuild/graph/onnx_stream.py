"""Load a single-file ONNX model without reading its weights: they become external data that
points into the ``.onnx`` file itself.

``onnx.load`` reads the whole file and then parses it, so a model with embedded weights peaks at
twice their size before anything else happens. ONNX external data may name any file with an
offset, the model's own file included, so this reader walks the protobuf wire format over a
memory-mapped file, copies everything but the large ``raw_data`` fields (and packed
``float_data`` / ``double_data``, laid out alike) of the main graph's initializers and
``Constant`` nodes, and records where those bytes are instead. onnx_ir then maps each weight from the
file when it is read, like any external tensor. The walk is the protobuf encoding's documented
shape (tag = field << 3 | wire type; varint, fixed 64-bit, length-delimited, fixed 32-bit) over
these fields:

    ModelProto.graph (7) -> GraphProto.initializer (5) -> TensorProto.raw_data (9)
                          GraphProto.node (1) -> NodeProto.attribute (5) -> AttributeProto.t (5)
                                                 (a ``Constant`` node's value) -> TensorProto.raw_data (9)

Weights elsewhere (subgraphs, ``float_data`` lists) stay embedded and are parsed as usual.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER = 1, 5
NODE_ATTRIBUTE = 5
ATTRIBUTE_TENSOR = 5
TENSOR_FLOAT_DATA, TENSOR_RAW_DATA, TENSOR_DOUBLE_DATA = 4, 9, 10
# Fields whose bytes are the tensor's external-data layout: raw_data, and float_data and double_data
# when packed (little-endian IEEE values back to back; varint-coded int fields are not).
RAW_LAYOUT_FIELDS = (TENSOR_FLOAT_DATA, TENSOR_RAW_DATA, TENSOR_DOUBLE_DATA)
TENSOR_EXTERNAL_DATA = 13
TENSOR_DATA_LOCATION = 14
ENTRY_KEY, ENTRY_VALUE = 1, 2
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
# Smaller weights stay in the proto: mapping them would cost more than it saves.
MIN_EXTERNAL_BYTES = 1024


class WireFormatError(ValueError):
    """The bytes are not a protobuf message of the expected shape."""


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireFormatError(f"truncated or overlong varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the tag, start of the value, end of the value) of each
    field of the message in ``buf[start:end]``; a length-delimited value excludes its length."""
    pos = start
    while pos < end:
        tag_start = pos
        tag, pos = _read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if wire == VARINT:
            _, value_end = _read_varint(buf, pos, end)
        elif wire == FIXED64:
            value_end = pos + 8
        elif wire == FIXED32:
            value_end = pos + 4
        elif wire == LENGTH:
            length, pos = _read_varint(buf, pos, end)
            value_end = pos + length
        else:  # groups (3, 4) are not used by onnx.proto
            raise WireFormatError(f"unsupported wire type {wire} for field {field} at byte {tag_start}")
        if value_end > end or field == 0:
            raise WireFormatError(f"field {field} at byte {tag_start} runs past its message")
        yield field, wire, tag_start, pos, value_end
        pos = value_end


def _length_field(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | LENGTH) + _varint(len(payload)) + payload


def _external_entries(location: str, offset: int, length: int) -> bytes:
    entries = (("location", location), ("offset", str(offset)), ("length", str(length)))
    return b"".join(_length_field(TENSOR_EXTERNAL_DATA,
                                  _length_field(ENTRY_KEY, key.encode()) + _length_field(ENTRY_VALUE, value.encode()))
                    for key, value in entries)


def _initializer(buf, start: int, end: int, location: str) -> bytes | None:
    """The TensorProto in ``buf[start:end]`` with its data swapped for an external-data reference
    to the same bytes; None to keep it as it is (no such data, or a small one)."""
    kept, data = [], []
    for field, wire, tag_start, value_start, value_end in _fields(buf, start, end):
        if field in RAW_LAYOUT_FIELDS and wire == LENGTH:
            data.append((value_start, value_end))
        else:
            kept.append(bytes(buf[tag_start:value_end]))
    # several chunks of one packed field (protobuf allows it) are not one byte range
    if len(data) != 1 or data[0][1] - data[0][0] < MIN_EXTERNAL_BYTES:
        return None
    [(data_start, data_end)] = data
    return (b"".join(kept) + _external_entries(location, data_start, data_end - data_start)
            + _varint(TENSOR_DATA_LOCATION << 3 | VARINT) + _varint(EXTERNAL))


def _replace_fields(buf, start: int, end: int, rewrite) -> tuple[bytes | None, int]:
    """The message in ``buf[start:end]`` with each length-delimited field that ``rewrite(field,
    value_start, value_end) -> (bytes or None, count)`` returns bytes for replaced by them; None if
    nothing was. Also the sum of the counts."""
    pieces, count, changed = [], 0, False
    for field, wire, tag_start, value_start, value_end in _fields(buf, start, end):
        if wire == LENGTH:
            new, moved = rewrite(field, value_start, value_end)
            if new is not None:
                pieces.append(_length_field(field, new))
                count, changed = count + moved, True
                continue
        pieces.append(bytes(buf[tag_start:value_end]))
    return (b"".join(pieces) if changed else None), count


def _graph(buf, start: int, end: int, location: str) -> tuple[bytes | None, int]:
    """The GraphProto in ``buf[start:end]`` with the raw_data of its initializers and of its
    nodes' tensor attributes made external, and how many were."""

    def tensor(field, value_start, value_end):
        if field != ATTRIBUTE_TENSOR:
            return None, 0
        new = _initializer(buf, value_start, value_end, location)
        return new, int(new is not None)

    def attribute(field, value_start, value_end):
        return _replace_fields(buf, value_start, value_end, tensor) if field == NODE_ATTRIBUTE else (None, 0)

    def member(field, value_start, value_end):
        if field == GRAPH_INITIALIZER:
            return tensor(ATTRIBUTE_TENSOR, value_start, value_end)
        if field == GRAPH_NODE:
            return _replace_fields(buf, value_start, value_end, attribute)
        return None, 0

    return _replace_fields(buf, start, end, member)


def weightless_model_bytes(path: Path) -> tuple[bytes, int]:
    """The serialized ModelProto of ``path`` with the main graph's initializers pointing into
    ``path`` itself (``location`` is its file name), and how many tensors were moved."""
    path = Path(path)
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            raise WireFormatError("the file is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                pieces, moved = [], 0
                for field, wire, tag_start, value_start, value_end in _fields(view, 0, len(view)):
                    if field == MODEL_GRAPH and wire == LENGTH:
                        graph, moved = _graph(view, value_start, value_end, path.name)
                        if graph is not None:
                            pieces.append(_length_field(MODEL_GRAPH, graph))
                            continue
                    pieces.append(bytes(view[tag_start:value_end]))
                return b"".join(pieces), moved
            finally:
                view.release()


def load_streamed(path: str | os.PathLike) -> ir.Model:
    """``path`` as an onnx_ir model whose embedded initializers are memory-mapped from the file.

    Raises WireFormatError (a ValueError) or onnx's DecodeError if the file is not an ONNX model.
    """
    path = Path(path)
    data, _ = weightless_model_bytes(path)
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    del data
    model = ir.serde.deserialize_model(proto)
    ir.external_data.set_base_dir(model.graph, path.parent)
    return model
