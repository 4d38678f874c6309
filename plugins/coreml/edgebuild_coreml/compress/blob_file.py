"""Typed access to an ML program's weight file (``weights/weight.bin``) through coremltools' reader
and writer, keyed by the MIL protobuf's ``DataType`` of the value stored there."""

from __future__ import annotations

import numpy as np
from coremltools.libmilstoragepython import _BlobStorageReader, _BlobStorageWriter
from coremltools.proto import MIL_pb2

_DT = MIL_pb2.DataType

# DataType -> suffix of the reader's/writer's ``read_<x>_data`` / ``write_<x>_data``.
_ACCESSOR = {
    _DT.FLOAT16: "fp16",
    _DT.FLOAT32: "float",
    _DT.INT8: "int8",
    _DT.UINT8: "uint8",
    _DT.INT16: "int16",
    _DT.UINT16: "uint16",
    _DT.INT32: "int32",
    _DT.UINT32: "uint32",
    _DT.INT4: "int4",
    _DT.UINT1: "uint1",
    _DT.UINT2: "uint2",
    _DT.UINT3: "uint3",
    _DT.UINT4: "uint4",
    _DT.UINT6: "uint6",
}


class UnsupportedBlob(Exception):
    """A weight stored with a type this module cannot copy; callers fall back to coremltools."""


def is_supported(data_type: int) -> bool:
    return data_type in _ACCESSOR


def read_blob(reader: _BlobStorageReader, data_type: int, offset: int) -> np.ndarray:
    """The flat array stored at ``offset``; float16 comes back as float16 (the reader says uint16)."""
    if data_type not in _ACCESSOR:
        raise UnsupportedBlob(MIL_pb2.DataType.Name(data_type))
    values = getattr(reader, f"read_{_ACCESSOR[data_type]}_data")(offset)
    return values.view(np.float16) if data_type == _DT.FLOAT16 else values


def write_blob(writer: _BlobStorageWriter, data_type: int, values: np.ndarray) -> int:
    """Append ``values`` (flat; sub-byte types one element per uint8) and return its offset."""
    if data_type not in _ACCESSOR:
        raise UnsupportedBlob(MIL_pb2.DataType.Name(data_type))
    flat = np.ascontiguousarray(values).reshape(-1)
    if data_type == _DT.FLOAT16:
        flat = flat.view(np.uint16)
    return getattr(writer, f"write_{_ACCESSOR[data_type]}_data")(flat)


def open_reader(path) -> _BlobStorageReader:
    return _BlobStorageReader(str(path))


def open_writer(path) -> _BlobStorageWriter:
    """A writer that truncates ``path``; drop the last reference to flush and close it."""
    return _BlobStorageWriter(str(path), truncate_file=True)
