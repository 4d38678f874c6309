"""Which function converts which StableHLO op: one small module per op family registers its ops
here with ``@converts``, as onnx2torch's node converters do."""

from __future__ import annotations

from typing import Callable, Sequence

import onnx_ir as ir

Converter = Callable[..., Sequence[ir.Value]]
CONVERTERS: dict[str, Converter] = {}

# the modules that register converters; imported once, on the first conversion
FAMILIES = ("elementwise", "linalg", "reductions", "shapes", "indexing", "sorting", "control", "dynamic")


def converts(*op_names: str):
    """Register the decorated ``fn(op, cx) -> [ONNX values of op's results]`` for ``op_names``."""

    def register(fn: Converter) -> Converter:
        for name in op_names:
            CONVERTERS[name] = fn
        return fn

    return register


def load_families() -> None:
    import importlib

    for family in FAMILIES:
        try:
            importlib.import_module(f"edgebuild_jax.convert.{family}")
        except ModuleNotFoundError as exc:
            if exc.name != f"edgebuild_jax.convert.{family}":
                raise


def convert_op(op, cx) -> None:
    """Convert one MLIR op and bind its results; refuse an op no converter knows, naming it and
    its source line."""
    name = op.operation.name
    converter = CONVERTERS.get(name)
    if converter is None:
        raise cx.error(op, "this op is not supported",
                       hint="report it with the op and its shapes; rewrite the source to avoid it meanwhile")
    results = converter(op, cx)
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    if len(results) != len(op.results):
        raise AssertionError(f"converter for {name} returned {len(results)} values for {len(op.results)} results")
    for mlir_result, onnx_value in zip(op.results, results):
        cx.annotate(onnx_value, mlir_result)
        cx.bind(mlir_result, onnx_value)


def supported_ops() -> list[str]:
    load_families()
    return sorted(CONVERTERS)
