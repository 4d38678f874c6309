"""``edgebuild inspect`` for .mlpackage files: ops, weights, compression, sizes, metadata."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

_COMPRESSED = {
    "constexpr_affine_dequantize": "linear", "constexpr_blockwise_shift_scale": "linear",
    "constexpr_lut_to_dense": "palettized", "constexpr_lut_to_sparse": "palettized+sparse",
    "constexpr_sparse_to_dense": "sparse", "constexpr_sparse_blockwise_shift_scale": "linear+sparse",
    "constexpr_cast": "fp16",
}


def _nbytes(value) -> int:
    return int(np.asarray(value).nbytes) if value is not None else 0


def _walk(block):
    """Every op of ``block`` and of the blocks nested in it (loops, conditions), consts included."""
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _walk(inner)


def inspect_mlpackage(path: Path) -> dict:
    import coremltools as ct

    from edgebuild_coreml.interpreter import load_mlpackage
    from edgebuild_coreml.lowering.names import read_metadata

    path = Path(path)
    program = load_mlpackage(path)
    main = program.functions["main"]
    ops, weights = Counter(), []
    for op in _walk(main):
        ops[op.op_type] += 1
        if op.op_type == "const" and op.outputs[0].val is not None and np.asarray(op.outputs[0].val).size > 16:
            value = np.asarray(op.outputs[0].val)
            weights.append({"name": op.name, "shape": list(value.shape), "dtype": str(value.dtype),
                            "bytes": _nbytes(value), "compression": None})
        elif op.op_type in _COMPRESSED:
            stored = sum(_nbytes(v.val) for v in op.inputs.values() if getattr(v, "val", None) is not None)
            out = op.outputs[0]
            weights.append({"name": op.name, "shape": [int(d) for d in out.shape], "dtype": str(out.dtype),
                            "bytes": stored, "compression": _COMPRESSED[op.op_type], "op": op.op_type})
    spec = ct.utils.load_spec(str(path))
    meta = spec.description.metadata
    renamed = read_metadata(meta.userDefined)
    onnx_of = {role: {a: o for o, a in renamed[role].items()} for role in ("inputs", "outputs")}
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    return {
        "artifact": str(path),
        "format": "mlpackage",
        "spec_version": spec.specificationVersion,
        "inputs": [{"name": i.name, "onnx": onnx_of["inputs"].get(i.name, i.name)} for i in spec.description.input],
        "outputs": [{"name": o.name, "onnx": onnx_of["outputs"].get(o.name, o.name)} for o in spec.description.output],
        "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
        "weights": weights,
        "weight_bytes": sum(w["bytes"] for w in weights),
        "compressed_weights": sum(1 for w in weights if w["compression"]),
        "size_bytes": sum(f.stat().st_size for f in files),
        "metadata": {"author": meta.author, "license": meta.license, "description": meta.shortDescription,
                     **dict(meta.userDefined)},
    }
