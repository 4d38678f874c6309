"""Reject MSL outside the emulated subset before compiling, naming the construct and line.

The emulation must never run something it does not model (a texture read, a function
pointer, a simdgroup matrix) as if it were something else; each pattern below is a
construct of MSL that the header does not provide, with the words the error uses.
"""

from __future__ import annotations

import re

from edgebuild_msl.errors import UnsupportedConstruct
from edgebuild_msl.source import line_of, strip_comments

UNSUPPORTED: tuple[tuple[str, str], ...] = (
    (r"\b(?:texture[123]d(?:_array|_ms(?:_array)?)?|texturecube(?:_array)?|texture_buffer|depth[2]d(?:_array|_ms(?:_array)?)?|depthcube(?:_array)?)\b",
     "textures"),
    (r"\bsampler\b|\bconstexpr\s+sampler\b", "samplers"),
    (r"\[\[\s*stage_in\s*\]\]", "[[stage_in]]"),
    (r"\b(?:vertex|fragment|mesh|object)\s+\w+\s+\w+\s*\(", "vertex, fragment, mesh and object functions (kernels only)"),
    (r"\b(?:command_buffer|compute_command|render_command|compute_pipeline_state|render_pipeline_state)\b",
     "indirect command buffers"),
    (r"\bimageblock\b|\[\[\s*imageblock_data", "imageblocks"),
    (r"\b(?:raytracing|intersector|acceleration_structure|intersection_function_table|ray_data)\b|\bray\b\s*\w*\s*\(",
     "raytracing"),
    (r"\b(?:visible_function_table|function_table)\b|\[\[\s*(?:visible|stitchable)\s*\]\]", "visible functions / function tables"),
    (r"\(\s*\*\s*\w+\s*\)\s*\(", "function pointers"),
    (r"\bsimdgroup_(?:matrix|float8x8|half8x8|bfloat8x8|load|store|multiply|multiply_accumulate)\b", "simdgroup_matrix"),
    (r"\b(?:device|constant|threadgroup)\b[^;(){}=,]*\*\s*(?:const\s+)?(?:device\s+|constant\s+)?\*", "pointers to pointers"),
    (r"\b(?:device|constant|threadgroup)\b[^;(){}=,]*\*[^;(){}=,]*\b(?:device|constant)\b[^;(){}=,]*\*", "pointers to pointers"),
    (r"\[\[\s*id\s*\(", "argument buffers ([[id(n)]])"),
    (r"\bstruct\s+\w*\s*\{[^}]*\b(?:device|constant)\b[^};]*\*", "argument buffers (structs holding device pointers)"),
    (r"\[\[\s*function_constant\s*\(", "function constants"),
    (r"\bquad_\w+\s*\(", "quad-group functions"),
    (r"\bsimd_(?:ballot|vote|active_threads_mask|is_helper_thread)\b", "simd_ballot / simd_vote"),
    (r"\bbfloat\d?\b", "bfloat"),
    (r"\bpacked_\w+\b", "packed vector types"),
    (r"\b(?:metal::)?array\s*<", "metal::array"),
    (r"\batomic_(?:bool|ulong|long)\b|\batomic\s*<", "atomics other than atomic_int, atomic_uint and atomic_float"),
    (r"\b(?:half|float)[234]x[234]\b", "matrix types"),
    (r"#\s*include\s*[<\"](?!metal_)", "#include of files other than <metal_*>"),
)


def scan_unsupported(source: str, *, kernel_label: str) -> None:
    """Raise UnsupportedConstruct for the first construct outside the subset, with its line."""
    text = strip_comments(source)
    hits = []
    for pattern, construct in UNSUPPORTED:
        match = re.search(pattern, text)
        if match:
            hits.append((match.start(), construct, match.group(0)))
    if hits:
        offset, construct, spelled = min(hits)
        line = line_of(text, offset)
        raise UnsupportedConstruct(
            f"kernel {kernel_label}, line {line}: {construct} (`{' '.join(spelled.split())}`) is outside the MSL subset "
            f"edgebuild emulates",
            hint="docs/msl.md lists what is supported; the macOS path still compiles it with xcrun metal, "
                 "but it cannot be checked on Linux",
        )
