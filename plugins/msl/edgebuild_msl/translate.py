"""Turn an MSL kernel into a C++ translation unit for the emulation header, plus its harness.

The rewrite is deliberately light, so compiler errors still point at the kernel's own lines:
``kernel`` is dropped, ``[[...]]`` attributes are blanked, ``threadgroup`` variables become
statics (shared by the lanes of the one threadgroup running at a time), ``1.0h`` literals
become ``half`` values. The harness reads buffers, dispatches the grid and writes outputs.
"""

from __future__ import annotations

import re

from edgebuild_msl.signature import POSITION_ATTRIBUTES, POSITION_TYPES, KernelSignature, Parameter
from edgebuild_msl.source import strip_comments

_COOPERATIVE = re.compile(r"\bthreadgroup_barrier\b|\bsimdgroup_barrier\b|\bsimd_\w+\s*\(|\bthreadgroup\b")
_HALF_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[hH]\b")
_THREADGROUP_VARIABLE = re.compile(r"\bthreadgroup(\s+(?:metal::)?\w+(?:\s*<[^>;]*>)?\s+\w+\s*[\[;])")
_ATTRIBUTE = re.compile(r"\[\[.*?\]\]", re.S)


def is_cooperative(source: str) -> bool:
    """Whether lanes talk to each other (barriers, SIMD-group functions, threadgroup memory)."""
    return bool(_COOPERATIVE.search(strip_comments(source)))


def kernel_body(source: str, name: str) -> str:
    """The kernel source, rewritten for the header; line numbers unchanged."""
    text = strip_comments(source)
    text = re.sub(r"\bkernel(\s+)void\b", lambda m: "void" + m.group(1).replace(" ", ""), text)
    text = _ATTRIBUTE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    text = _THREADGROUP_VARIABLE.sub(r"static\1", text)
    text = _HALF_LITERAL.sub(r"half(\1f)", text)
    text = re.sub(r"#\s*include\s*<metal_\w+>", '#include "msl.h"', text)
    return f'#include "msl.h"\n#line 1 "{name}"\n{text}\n#include "msl_end.h"\n'


def harness(sig: KernelSignature, *, cooperative: bool, workers: int) -> str:
    """``main``: argv = grid xyz, threadgroup xyz, then one buffer spec per buffer/threadgroup parameter."""
    bound = [p for p in sig.parameters if p.attribute in ("buffer", "threadgroup")]
    lines = [
        '#line 1 "edgebuild-msl-harness.cpp"',
        "using namespace metal;",
        "int main(int argc, char** argv) {",
        f"  if (argc != {7 + len(bound)}) eb::fail(\"harness: wrong argument count\");",
        "  auto arg = [&](int i) { return uint(std::strtoul(argv[i], nullptr, 10)); };",
        "  eb::Grid grid{uint3(arg(1), arg(2), arg(3)), uint3(arg(4), arg(5), arg(6))};",
        "  std::vector<eb::Buffer> buffers;",
        f"  buffers.reserve({len(bound)});",
        "  for (int i = 7; i < argc; ++i) buffers.push_back(eb::make_buffer(argv[i]));",
    ]
    for k, p in enumerate(bound):
        lines.append(f"  auto* b{k} = reinterpret_cast<{_pointee(p)}*>(buffers[{k}].data());")
    args = []
    for p in sig.parameters:
        if p.attribute in ("buffer", "threadgroup"):
            k = bound.index(p)
            args.append(f"*b{k}" if p.indirection == "&" else f"b{k}")
        else:
            args.append(_position_argument(p))
    call = f"{sig.entry}({', '.join(args)})"
    if cooperative:
        lines.append(f"  eb::dispatch_cooperative(grid, [&](const eb::Ids& id) {{ {call}; }});")
    else:
        lines.append(f"  eb::dispatch_independent(grid, [&](const eb::Ids& id) {{ {call}; }}, {workers}u);")
    lines += ["  eb::write_outputs(buffers);", "  return 0;", "}", ""]
    return "\n".join(lines)


def translation_unit(source: str, sig: KernelSignature, *, name: str, workers: int = 2) -> str:
    return kernel_body(source, name) + harness(sig, cooperative=is_cooperative(source), workers=workers)


def _pointee(p: Parameter) -> str:
    const = "const " if (p.const or p.address_space == "constant") else ""
    return f"{const}{p.type}"


def _position_argument(p: Parameter) -> str:
    value = f"id.{p.attribute}"
    width = POSITION_TYPES[p.type]
    if POSITION_ATTRIBUTES[p.attribute] == 1:
        return f"{p.type}({value})"
    return f"{p.type}({', '.join(f'{value}.{c}' for c in 'xyz'[:width])})"
