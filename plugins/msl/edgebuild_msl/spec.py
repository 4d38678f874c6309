"""The declaration of a custom op implemented by a Metal kernel: what the build checks, runs and ships.

Example::

    KernelSpec(
        domain="com.example", op_type="VectorAdd",
        inputs=[TensorDecl("a", "float32", 1), TensorDecl("b", "float32", 1)],
        outputs=[TensorDecl("c", "float32", 1)],
        source=VECTOR_ADD_MSL, entry="vector_add",
        buffers={"a": 0, "b": 1, "c": 2},
        constants=[ConstantBinding("n", 3, "uint", lambda shapes, attrs: shapes["a"][0])],
        grid=lambda shapes: (shapes["a"][0], 1, 1), threadgroup=(256, 1, 1),
        output_shapes=lambda shapes: {"c": shapes["a"]},
        reference=lambda a, b: a + b,
    )

Sizing functions take ``shapes`` (input name -> shape tuple) and, when they accept a second
parameter, ``attrs`` (attribute name -> value, defaults applied).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

# ONNX-style dtype names -> (numpy dtype, the MSL scalar type a buffer of it holds)
DTYPES: dict[str, tuple[type, str]] = {
    "float32": (np.float32, "float"),
    "float16": (np.float16, "half"),
    "int32": (np.int32, "int"),
    "uint32": (np.uint32, "uint"),
    "int16": (np.int16, "short"),
    "uint16": (np.uint16, "ushort"),
    "int8": (np.int8, "char"),
    "uint8": (np.uint8, "uchar"),
    "bool": (np.bool_, "bool"),
}
# MSL scalar type of a constant binding -> numpy dtype of the bytes passed for it
CONSTANT_TYPES: dict[str, type] = {"uint": np.uint32, "int": np.int32, "float": np.float32, "half": np.float16,
                                   "ushort": np.uint16, "short": np.int16, "bool": np.bool_}

Shape = tuple[int, ...]
Sizing = Union[Sequence[int], Callable[..., Sequence[int]]]


@dataclass(frozen=True)
class TensorDecl:
    """An input or output of the op. ``rank=None`` accepts any rank."""

    name: str
    dtype: str = "float32"
    rank: int | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"tensor {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")

    @property
    def numpy_dtype(self):
        return np.dtype(DTYPES[self.dtype][0])

    @property
    def msl_type(self) -> str:
        return DTYPES[self.dtype][1]


@dataclass(frozen=True)
class ConstantBinding:
    """A scalar passed at ``[[buffer(index)]]`` as ``constant <dtype>& name``.

    ``value`` is an attribute name, a number, or ``fn(shapes[, attrs])``.
    """

    name: str
    index: int
    dtype: str = "uint"
    value: Union[str, int, float, Callable[..., Any]] = 0

    def __post_init__(self):
        if self.dtype not in CONSTANT_TYPES:
            raise ValueError(f"constant {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(CONSTANT_TYPES)}")

    def evaluate(self, shapes: Mapping[str, Shape], attrs: Mapping[str, Any]) -> np.ndarray:
        if isinstance(self.value, str):
            raw = attrs[self.value]
        elif callable(self.value):
            raw = call_sizing(self.value, shapes, attrs)
        else:
            raw = self.value
        return np.asarray(raw, dtype=CONSTANT_TYPES[self.dtype]).reshape(())


@dataclass
class KernelSpec:
    """A custom op (ONNX ``domain`` + ``op_type``) and the Metal kernel that computes it."""

    domain: str
    op_type: str
    inputs: Sequence[TensorDecl]
    outputs: Sequence[TensorDecl]
    source: Union[str, Path]  # MSL text, or a Path to a .metal file
    entry: str  # the ``kernel void`` function to run
    buffers: Mapping[str, int]  # input/output name -> [[buffer(i)]]
    grid: Sizing  # threads per grid (dispatchThreads): (x, y, z) or fn(shapes[, attrs])
    threadgroup: Sizing  # threads per threadgroup
    output_shapes: Callable[..., Mapping[str, Sequence[int]]]
    reference: Callable[..., Any]  # numpy: reference(*inputs, **attrs) -> array or tuple
    constants: Sequence[ConstantBinding] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)  # name -> default
    # [[threadgroup(i)]] parameter index -> bytes, or fn(shapes[, attrs]) -> bytes
    threadgroup_memory: Mapping[int, Union[int, Callable[..., int]]] = field(default_factory=dict)
    schema: Any = None  # onnx.defs.OpSchema or None
    description: str = ""
    # input name -> shape used by `edgebuild kernels` to check the kernel on random data
    example_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def source_text(self) -> str:
        return Path(self.source).read_text() if isinstance(self.source, Path) else str(self.source)

    def source_name(self) -> str:
        return Path(self.source).name if isinstance(self.source, Path) else f"{self.entry}.metal"

    def attrs_with_defaults(self, attrs: Mapping[str, Any] | None) -> dict[str, Any]:
        merged = dict(self.attributes)
        unknown = set(attrs or {}) - set(merged)
        if unknown:
            raise ValueError(f"{self.qualified_name}: unknown attribute(s) {', '.join(sorted(unknown))}")
        merged.update(attrs or {})
        return merged

    def dispatch_size(self, shapes: Mapping[str, Shape], attrs: Mapping[str, Any]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(threads per grid, threads per threadgroup), each padded to three dimensions."""
        return _dim3(call_sizing(self.grid, shapes, attrs)), _dim3(call_sizing(self.threadgroup, shapes, attrs))

    def output_shapes_for(self, shapes: Mapping[str, Shape], attrs: Mapping[str, Any]) -> dict[str, Shape]:
        """Each output's shape for these input shapes and attributes."""
        return call_sizing(self.output_shapes, shapes, attrs)

    def run_reference(self, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        result = self.reference(*(inputs[t.name] for t in self.inputs), **self.attrs_with_defaults(attrs))
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return {t.name: np.asarray(r) for t, r in zip(self.outputs, result)}


def call_sizing(sizing, shapes: Mapping[str, Shape], attrs: Mapping[str, Any]):
    """Evaluate a constant or ``fn(shapes)`` / ``fn(shapes, attrs)``."""
    if not callable(sizing):
        return sizing
    params = inspect.signature(sizing).parameters
    return sizing(shapes, attrs) if len(params) >= 2 else sizing(shapes)


def _dim3(size) -> tuple[int, int, int]:
    dims = [int(d) for d in (size if isinstance(size, (tuple, list)) else (size,))]
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
        raise ValueError(f"a dispatch size must be 1 to 3 non-negative ints, got {size!r}")
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]
