"""Parse a ``kernel void name(...)`` declaration and check it against a KernelSpec.

The checks are the ones a Metal pipeline would fail on at run time, or worse silently
misread: a buffer index bound to nothing, an input the kernel may write, an output it
cannot, an element type other than the declared dtype, a constant of the wrong type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgebuild_msl.errors import KernelError, UnsupportedConstruct
from edgebuild_msl.source import line_of, matching_paren, split_top_level, strip_comments
from edgebuild_msl.spec import KernelSpec

ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread")
# Thread-position attributes the emulation provides -> how many components they carry
POSITION_ATTRIBUTES = {
    "thread_position_in_grid": 3, "thread_position_in_threadgroup": 3, "threadgroup_position_in_grid": 3,
    "threads_per_threadgroup": 3, "threadgroups_per_grid": 3, "threads_per_grid": 3,
    "dispatch_threads_per_threadgroup": 3,
    "thread_index_in_threadgroup": 1, "thread_index_in_simdgroup": 1, "simdgroup_index_in_threadgroup": 1,
    "threads_per_simdgroup": 1, "simdgroups_per_threadgroup": 1, "thread_execution_width": 1,
}
POSITION_TYPES = {"uint": 1, "ushort": 1, "int": 1, "uint2": 2, "ushort2": 2, "uint3": 3, "ushort3": 3}
# A declared dtype's scalar -> element types a buffer parameter may use for it
_ELEMENT_TYPES = {
    "float": ("float", "float2", "float4"), "half": ("half", "half2", "half4"), "int": ("int", "int2", "int4"),
    "uint": ("uint", "uint2", "uint4"), "short": ("short",), "ushort": ("ushort",), "char": ("char",),
    "uchar": ("uchar",), "bool": ("bool",),
}
_ATOMIC_TYPES = {"int": "atomic_int", "uint": "atomic_uint", "float": "atomic_float"}

_ATTRIBUTE = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]")
_DECLARATOR = re.compile(
    r"^\s*(?P<space>(?:device|constant|threadgroup|thread)\s+)?(?P<const1>const\s+)?"
    r"(?P<type>(?:metal::)?\w+)\s*(?P<const2>const\s*)?(?P<ind>[*&]?)\s*(?P<name>\w+)\s*$"
)


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter, e.g. ``device const float* a [[buffer(0)]]``."""

    name: str
    type: str  # element/scalar type without address space or const, e.g. "float", "uint3"
    address_space: str | None
    const: bool
    indirection: str  # "*", "&" or ""
    attribute: str | None  # "buffer", "threadgroup", "thread_position_in_grid", ...
    index: int | None  # the N of buffer(N) / threadgroup(N)
    line: int
    text: str

    def spelled(self) -> str:
        return " ".join(self.text.split())


@dataclass(frozen=True)
class KernelSignature:
    entry: str
    parameters: tuple[Parameter, ...]
    line: int
    span: tuple[int, int]  # offsets of "kernel" .. ")" in the source

    def buffer(self, index: int) -> Parameter | None:
        return next((p for p in self.parameters if p.attribute == "buffer" and p.index == index), None)


def find_kernels(text: str) -> list[str]:
    return re.findall(r"\bkernel\s+void\s+(\w+)\s*\(", strip_comments(text))


def parse_signature(source: str, entry: str, *, kernel_label: str | None = None) -> KernelSignature:
    """The parameters of ``kernel void <entry>(...)`` in ``source``."""
    label = kernel_label or repr(entry)
    text = strip_comments(source)
    match = re.search(rf"\bkernel\s+void\s+{re.escape(entry)}\s*\(", text)
    if not match:
        found = find_kernels(source)
        raise KernelError(
            f"kernel {label}: no `kernel void {entry}(...)` in the source",
            hint=f"kernels found: {', '.join(found)}" if found else "declare the entry point as `kernel void name(...)`",
        )
    open_at = match.end() - 1
    close_at = matching_paren(text, open_at)
    params = []
    for offset, part in split_top_level(text[open_at + 1:close_at]):
        params.append(_parse_parameter(part, line_of(text, open_at + 1 + offset + len(part) - len(part.lstrip())), label))
    return KernelSignature(entry, tuple(params), line_of(text, match.start()), (match.start(), close_at + 1))


def _parse_parameter(text: str, line: int, label: str) -> Parameter:
    attributes = _ATTRIBUTE.findall(text)
    declarator = _ATTRIBUTE.sub(" ", text)
    if "[[" in declarator:
        raise UnsupportedConstruct(f"kernel {label}, line {line}: attribute in `{' '.join(text.split())}` is not understood",
                                   hint="see docs/msl.md for the supported parameter attributes")
    m = _DECLARATOR.match(declarator)
    if not m:
        raise UnsupportedConstruct(
            f"kernel {label}, line {line}: parameter `{' '.join(text.split())}` is not a supported declaration",
            hint="parameters are `[device|constant|threadgroup] [const] T[*|&] name [[attribute]]`; "
                 "structs of pointers (argument buffers), arrays and pointers to pointers are outside the subset",
        )
    if len(attributes) > 1:
        raise UnsupportedConstruct(f"kernel {label}, line {line}: parameter {m['name']!r} has several attributes")
    attribute, index = (attributes[0][0], int(attributes[0][1]) if attributes[0][1] else None) if attributes else (None, None)
    return Parameter(
        name=m["name"], type=m["type"].removeprefix("metal::"), address_space=(m["space"] or "").strip() or None,
        const=bool(m["const1"] or m["const2"]), indirection=m["ind"], attribute=attribute, index=index,
        line=line, text=text.strip(),
    )


def check_signature(spec: KernelSpec, source: str | None = None) -> KernelSignature:
    """Parse the entry point of ``spec`` and check every parameter against the declaration."""
    source = spec.source_text() if source is None else source
    label = f"{spec.entry!r} ({spec.qualified_name})"
    sig = parse_signature(source, spec.entry, kernel_label=label)

    def fail(param: Parameter | None, problem: str, hint: str | None = None):
        where = f", parameter {param.name!r} (line {param.line}: `{param.spelled()}`)" if param else ""
        raise KernelError(f"kernel {label}{where}: {problem}", hint=hint)

    _check_declared_indices(spec, fail)
    tensors = {t.name: (t, "input") for t in spec.inputs} | {t.name: (t, "output") for t in spec.outputs}
    by_index = {index: name for name, index in spec.buffers.items()}
    constants = {c.index: c for c in spec.constants}
    bound = {p.index for p in sig.parameters if p.attribute == "buffer"}
    for name, index in spec.buffers.items():
        if index not in bound:
            fail(None, f"{tensors[name][1]} {name!r} is declared at [[buffer({index})]] but no kernel parameter has that index")
    for c in spec.constants:
        if c.index not in bound:
            fail(None, f"constant {c.name!r} is declared at [[buffer({c.index})]] but no kernel parameter has that index")
    for index in spec.threadgroup_memory:
        if not any(p.attribute == "threadgroup" and p.index == index for p in sig.parameters):
            fail(None, f"threadgroup memory {index} is declared but no parameter has [[threadgroup({index})]]")
    for param in sig.parameters:
        if param.attribute is None:
            fail(param, "has no attribute; every kernel parameter needs one ([[buffer(i)]], [[thread_position_in_grid]], ...)")
        if param.attribute == "buffer":
            if param.index in by_index:
                tensor, role = tensors[by_index[param.index]]
                _check_tensor_parameter(param, tensor, role, fail)
            elif param.index in constants:
                _check_constant_parameter(param, constants[param.index], fail)
            else:
                fail(param, f"[[buffer({param.index})]] is bound to nothing in the declaration",
                     hint="add it to `buffers` (a tensor) or `constants` (a scalar), or drop the parameter")
        elif param.attribute == "threadgroup":
            if param.address_space != "threadgroup" or param.indirection != "*":
                fail(param, "a [[threadgroup(i)]] parameter must be a `threadgroup T*` pointer")
            if param.index not in spec.threadgroup_memory:
                fail(param, f"[[threadgroup({param.index})]] has no size in the declaration",
                     hint=f"set threadgroup_memory={{{param.index}: bytes or fn(shapes)}}")
        elif param.attribute in POSITION_ATTRIBUTES:
            if param.type not in POSITION_TYPES or param.indirection or param.address_space:
                fail(param, f"[[{param.attribute}]] must be a plain {'/'.join(POSITION_TYPES)} value")
            if POSITION_TYPES[param.type] > POSITION_ATTRIBUTES[param.attribute]:
                fail(param, f"[[{param.attribute}]] is a scalar; declare it as uint")
        else:
            raise UnsupportedConstruct(
                f"kernel {label}, line {param.line}: parameter attribute [[{param.attribute}]] is outside the supported MSL subset",
                hint="see docs/msl.md (stage_in, textures, samplers and argument buffers are not emulated)",
            )
    return sig


def _check_declared_indices(spec: KernelSpec, fail) -> None:
    names = [t.name for t in (*spec.inputs, *spec.outputs)]
    for name in names:
        if name not in spec.buffers:
            fail(None, f"tensor {name!r} has no [[buffer(i)]] index in `buffers`")
    for name in spec.buffers:
        if name not in names:
            fail(None, f"`buffers` names {name!r}, which is not an input or output of the op")
    seen: dict[int, str] = {}
    for name, index in [*spec.buffers.items(), *((c.name, c.index) for c in spec.constants)]:
        if index in seen:
            fail(None, f"[[buffer({index})]] is declared twice ({seen[index]!r} and {name!r})")
        seen[index] = name


def _check_tensor_parameter(param: Parameter, tensor, role: str, fail) -> None:
    scalar = tensor.msl_type
    allowed = _ELEMENT_TYPES[scalar] + ((_ATOMIC_TYPES[scalar],) if role == "output" and scalar in _ATOMIC_TYPES else ())
    if param.indirection != "*":
        fail(param, f"{role} {tensor.name!r} must be a pointer (`device {'const ' if role == 'input' else ''}{scalar}*`)")
    if param.type not in allowed:
        fail(param, f"{role} {tensor.name!r} is {tensor.dtype}, so its elements are {' or '.join(allowed)}, not {param.type}")
    if role == "input":
        if param.address_space == "device" and not param.const:
            fail(param, f"input {tensor.name!r} is writable; declare it `device const {param.type}*`",
                 hint="inputs are shared with other segments and must not be modified")
        if param.address_space not in ("device", "constant"):
            fail(param, f"input {tensor.name!r} must be in the device or constant address space")
    else:
        if param.address_space != "device" or param.const:
            fail(param, f"output {tensor.name!r} must be writable: `device {scalar}*`, not `{param.spelled()}`")


def _check_constant_parameter(param: Parameter, binding, fail) -> None:
    if param.address_space != "constant" or param.indirection not in ("&", "*"):
        fail(param, f"constant {binding.name!r} must be `constant {binding.dtype}& {param.name}`")
    if param.type != binding.dtype:
        fail(param, f"constant {binding.name!r} is declared {binding.dtype}, the kernel reads {param.type}")
