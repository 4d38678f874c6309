"""The serialized MPSGraph program: ``program.json`` (graph) + ``weights.bin`` (constants).

``program.json``::

    {"format": "edgebuild-mpsgraph", "version": 1,
     "inputs":  [{"name": "x", "dtype": "float32", "shape": [1, 3, 224, 224]}],
     "outputs": [{"name": "y", "dtype": "float32", "shape": [1, 4]}],
     "constants": [{"name": "w", "dtype": "float32", "shape": [16, 3, 3, 3], "offset": 0, "nbytes": 1728}],
     "tensors": {"t": {"dtype": "float32", "shape": [...]}, ...},
     "ops": [{"op": "convolution2D", "name": "Conv_0", "inputs": ["x", "w"], "outputs": ["t"],
              "attrs": {"strideInX": 1, ...}}]}

Op names are MPSGraph's method stems (``additionWithPrimaryTensor:...`` -> ``addition``) and
attributes its descriptor properties, so a runtime builds each op with one call. Constants sit
in ``weights.bin`` at offsets aligned to :data:`ALIGNMENT` bytes, little-endian, row-major, so
a runtime can wrap them without copying (``MTLBuffer`` / ``NSData`` over an mmap).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgebuild.plugin import BuildError

FORMAT = "edgebuild-mpsgraph"
VERSION = 1
ALIGNMENT = 64
PROGRAM_FILE = "program.json"
WEIGHTS_FILE = "weights.bin"
DTYPES = ("float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


@dataclass
class Op:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    name: str = ""  # the ONNX node it came from, for error messages


@dataclass
class Program:
    """An MPSGraph program in memory: ``constants`` hold numpy arrays until saved."""

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name -> (dtype, shape)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.op] = counts.get(op.op, 0) + 1
        return dict(sorted(counts.items()))


def _tensor_record(name: str, dtype: str, shape) -> dict:
    return {"name": name, "dtype": dtype, "shape": [int(d) for d in shape]}


def save_program(program: Program, directory: Path) -> dict:
    """Write ``program.json`` and ``weights.bin`` into ``directory``; returns size info."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    constants, offset = [], 0
    with open(directory / WEIGHTS_FILE, "wb") as weights:
        for name, array in program.constants.items():
            data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            padding = -offset % ALIGNMENT
            weights.write(b"\0" * padding)
            offset += padding
            weights.write(data)
            constants.append({**_tensor_record(name, array.dtype.name, array.shape), "offset": offset, "nbytes": len(data)})
            offset += len(data)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [_tensor_record(n, *program.tensors[n]) for n in program.inputs],
        "outputs": [_tensor_record(n, *program.tensors[n]) for n in program.outputs],
        "constants": constants,
        "tensors": {n: {"dtype": d, "shape": [int(s) for s in shape]} for n, (d, shape) in program.tensors.items()},
        "ops": [{"op": op.op, "name": op.name, "inputs": op.inputs, "outputs": op.outputs, "attrs": op.attrs}
                for op in program.ops],
    }
    (directory / PROGRAM_FILE).write_text(json.dumps(document, indent=1))
    return {"ops": len(program.ops), "constants": len(constants), "weights_bytes": offset}


def load_program(directory: Path) -> Program:
    """Read a saved program back; constants are views into a memory map of ``weights.bin``."""
    directory = Path(directory)
    path = directory / PROGRAM_FILE
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT or document.get("version") != VERSION:
        raise BuildError(f"{path}: not an {FORMAT} program of version {VERSION} "
                         f"(found {document.get('format')!r} version {document.get('version')!r})",
                         hint="rebuild the bundle with this version of edgebuild-mpsgraph")
    weights_path = directory / WEIGHTS_FILE
    blob = np.memmap(weights_path, dtype=np.uint8, mode="r") if weights_path.stat().st_size else np.zeros(0, np.uint8)
    program = Program(
        inputs=[t["name"] for t in document["inputs"]],
        outputs=[t["name"] for t in document["outputs"]],
        tensors={n: (t["dtype"], tuple(t["shape"])) for n, t in document["tensors"].items()},
        ops=[Op(o["op"], o["inputs"], o["outputs"], o.get("attrs", {}), o.get("name", "")) for o in document["ops"]],
    )
    for record in document["constants"]:
        raw = blob[record["offset"]:record["offset"] + record["nbytes"]]
        program.constants[record["name"]] = raw.view(np.dtype(record["dtype"]).newbyteorder("<")).reshape(record["shape"])
    return program
