"""The files an ONNX model reads its external data from, found without onnx_ir (the resolve stage
asks on every run, before anything heavy is imported)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# An external tensor names its file in an entry whose key is "location" (field 1 of a
# StringStringEntryProto, length 8): a file without these bytes has no external data.
_LOCATION_KEY = b"\x0a\x08location"


def external_data_files(path: Path) -> list[Path]:
    """The files inside ``path``'s directory that the ONNX model ``path`` reads external data from,
    sorted; files missing or outside are left to the import's checks. A model without external
    data is found so by a scan of its bytes, not a parse (a single-file model may be gigabytes)."""
    path = Path(path)
    if not _holds(path, _LOCATION_KEY):
        return []
    import onnx  # only now: most runs of a model without external data never import it

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not a model: the import says so, naming the file
        return []
    root = Path(os.path.realpath(path.parent))
    found = set()
    for tensor in _proto_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if not location or os.path.isabs(location):
            continue
        file = Path(os.path.realpath(root / location))
        if root in file.parents and file.is_file():
            found.add(path.parent / os.path.relpath(file, root))
    return sorted(found)


def _holds(path: Path, needle: bytes, chunk: int = 1 << 20) -> bool:
    """Whether the file holds ``needle``, read a piece at a time (a mapping of the whole file would
    count a gigabyte model in the process's resident memory)."""
    tail = b""
    with open(path, "rb") as file:
        while piece := file.read(chunk):
            if needle in tail + piece[:len(needle) - 1] or needle in piece:
                return True
            tail = piece[-(len(needle) - 1):]
    return False


def _proto_tensors(graph) -> Iterator:
    """Every TensorProto of an ``onnx.GraphProto``: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _proto_tensors(attr.g)
            for sub in attr.graphs:
                yield from _proto_tensors(sub)
