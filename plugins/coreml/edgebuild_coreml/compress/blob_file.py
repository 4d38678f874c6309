"""An ML program's weight file (``weights/weight.bin``), read through a memory map and written
sequentially, without coremltools' storage library.

The layout (coremltools' ``MILBlob`` storage, version 2) is simple: a 64-byte header (blob
count, version), then per blob a 64-byte metadata record (sentinel ``0xDEADBEEF``, blob type,
byte size, absolute data offset, padding bits in the last byte) followed by the data, each
record starting on a 64-byte boundary. A value's ``blobFileValue.offset`` is its record's
offset. Reading through a map hands out views instead of copies, and writing ourselves lets a
copied blob go from the map to the file and packed indices go out as they are produced.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from coremltools.proto import MIL_pb2

_DT = MIL_pb2.DataType
_HEADER = struct.Struct("<II56x")  # blob count, version
_RECORD = struct.Struct("<IIQQQ32x")  # sentinel, blob type, bytes, data offset, padding bits
_SENTINEL = 0xDEADBEEF
_VERSION = 2
_ALIGN = 64

# MIL DataType -> (blob type code in the file, bits per element).
_BLOB_TYPE = {
    _DT.FLOAT16: (1, 16),
    _DT.FLOAT32: (2, 32),
    _DT.UINT8: (3, 8),
    _DT.INT8: (4, 8),
    _DT.BFLOAT16: (5, 16),
    _DT.INT16: (6, 16),
    _DT.UINT16: (7, 16),
    _DT.INT4: (8, 4),
    _DT.UINT1: (9, 1),
    _DT.UINT2: (10, 2),
    _DT.UINT4: (11, 4),
    _DT.UINT3: (12, 3),
    _DT.UINT6: (13, 6),
    _DT.INT32: (14, 32),
    _DT.UINT32: (15, 32),
}
_NUMPY = {_DT.FLOAT16: np.float16, _DT.FLOAT32: np.float32}


class BadBlob(Exception):
    """The file does not hold a blob record where the program says; callers fall back."""


def is_supported(data_type: int) -> bool:
    return data_type in _BLOB_TYPE


@dataclass(frozen=True)
class BlobRecord:
    """One blob's metadata: type code, data position and size, unused bits at the end."""

    blob_type: int
    data_offset: int
    size: int
    padding_bits: int


class BlobReader:
    """Read-only memory map of a weight file; arrays it returns are views into the map."""

    def __init__(self, path):
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        if self._map.size() < _HEADER.size or _HEADER.unpack_from(self._map, 0)[1] != _VERSION:
            raise BadBlob(f"{path}: not a version {_VERSION} weight file")

    def record(self, offset: int) -> BlobRecord:
        if offset < 0 or offset + _RECORD.size > self._map.size():
            raise BadBlob(f"no blob record at offset {offset}")
        sentinel, blob_type, size, data_offset, padding = _RECORD.unpack_from(self._map, offset)
        if sentinel != _SENTINEL or data_offset + size > self._map.size():
            raise BadBlob(f"no blob record at offset {offset}")
        return BlobRecord(blob_type, data_offset, size, padding)

    def raw(self, offset: int) -> np.ndarray:
        """The stored bytes of the blob at ``offset`` (uint8 view)."""
        record = self.record(offset)
        return self._bytes[record.data_offset : record.data_offset + record.size]

    def drop_pages(self, offset: int) -> None:
        """Drop the resident pages of the blob at ``offset`` once it was read: the map is read-only,
        a later read faults them back from the file, and a pass over every blob keeps one resident."""
        from edgebuild_coreml.memory import drop_mapped_pages

        drop_mapped_pages([self.raw(offset)])

    def array(self, data_type: int, offset: int) -> np.ndarray:
        """The flat float16/float32 values at ``offset`` (a view)."""
        record = self.record(offset)
        if data_type not in _NUMPY or record.blob_type != _BLOB_TYPE[data_type][0]:
            raise BadBlob(f"blob at offset {offset} is not {MIL_pb2.DataType.Name(data_type)}")
        return self.raw(offset).view(_NUMPY[data_type])


class BlobWriter:
    """Writes a weight file front to back; ``close`` fills in the header's blob count."""

    def __init__(self, path):
        self._file = open(Path(path), "wb")
        self._file.write(_HEADER.pack(0, _VERSION))
        self._end = _HEADER.size
        self._count = 0

    def write(self, data_type: int, data, count: int | None = None) -> int:
        """Append stored bytes ``data`` holding ``count`` elements of ``data_type``; returns the
        offset of the blob's record (the value for ``blobFileValue.offset``).

        ``data`` is the exact stored form: sub-byte elements already packed (see ``packing``).
        ``count`` defaults to what fills ``data`` exactly.
        """
        blob_type, bits = _BLOB_TYPE[data_type]
        payload = memoryview(np.ascontiguousarray(data)).cast("B")
        size = payload.nbytes
        count = size * 8 // bits if count is None else count
        padding_bits = size * 8 - count * bits
        if not 0 <= padding_bits < 8:
            raise ValueError(f"{size} bytes cannot hold exactly {count} elements of {bits} bits")
        return self.write_record(blob_type, payload, padding_bits)

    def copy(self, reader: BlobReader, offset: int) -> int:
        """Append the blob at ``offset`` of ``reader`` unchanged; returns its new record offset."""
        record = reader.record(offset)
        return self.write_record(record.blob_type, memoryview(reader.raw(offset)), record.padding_bits)

    def write_record(self, blob_type: int, payload: memoryview, padding_bits: int) -> int:
        start = -(-self._end // _ALIGN) * _ALIGN
        data_offset = start + _RECORD.size
        record = _RECORD.pack(_SENTINEL, blob_type, payload.nbytes, data_offset, padding_bits)
        self._file.write(bytes(start - self._end) + record)
        self._file.write(payload)
        self._end = data_offset + payload.nbytes
        self._count += 1
        return start

    def close(self) -> None:
        self._file.seek(0)
        self._file.write(_HEADER.pack(self._count, _VERSION))
        self._file.close()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
