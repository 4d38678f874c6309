"""Overrides that name a weight by its role in the model (``match: {role: lm_head}``), resolved to
op names before anything compresses.

The LM head is found by structure, not by name (the optimiser renames and renumbers ops, and
each family's exporter names them differently): walking back from the ``logits`` output through
ops that keep the vocabulary axis (casts, a final soft-capping's scalar div/tanh/mul, the
last-token slice, reshapes) to the first ``linear`` or ``matmul`` that reads a weight. Every op
reading that weight is matched, so a head tied to the embedding table takes the embedding's
``gather`` with it when the package stores the two as one table (which can have only one encoding).
"""

from __future__ import annotations

import re
from pathlib import Path

from edgebuild.plugin import BuildError

from .config import CompressionSection, Override, OverrideMatch
from .spec_palettize import NotEditable, _read_spec
from .spec_program import iter_block_ops, main_blocks, op_name

LOGITS = "logits"
_PROJECTIONS = ("linear", "matmul")
# Ops between the head's projection and the logits output that keep the vocabulary axis.
_PASS_THROUGH = {"cast", "mul", "real_div", "add", "sub", "tanh", "slice_by_index", "slice_by_size", "reshape",
                 "squeeze", "expand_dims", "identity", "gather", "gather_along_axis", "transpose"}


def resolve_roles(section: CompressionSection, package: Path) -> CompressionSection:
    """``section`` with each ``role`` override replaced by one matching the role's ops by name."""
    if not any(override.match.role for override in section.overrides):
        return section
    names = lm_head_ops(Path(package))
    pattern = "|".join(re.escape(name) for name in names)
    overrides = [Override(match=OverrideMatch(name=pattern), weights=override.weights)
                 if override.match.role == "lm_head" else override for override in section.overrides]
    return section.model_copy(update={"overrides": overrides})


def lm_head_ops(package: Path) -> list[str]:
    """Names of the ops reading the LM head's weight: its projection (and, tied, the embedding gather)."""
    try:
        program = _read_spec(package).mlProgram
    except NotEditable as error:
        raise BuildError(f"compression role lm_head: {error}", hint="name the head's op with match: {name: ...}") from None
    for _, block in main_blocks(program):
        if LOGITS not in block.outputs:
            continue
        ops = list(iter_block_ops(block))
        produced = {output.name: op for op in ops for output in op.outputs}
        weights = {name for name, op in produced.items() if op.type == "const" or op.type.startswith("constexpr_")}
        weight = _head_weight(LOGITS, produced, weights)
        if weight is None:
            raise BuildError(f"compression.overrides: match {{role: lm_head}}: no linear or matmul reading a weight "
                             f"produces the model's '{LOGITS}' output",
                             hint="name the head's op with match: {name: ...} (see compress.weights in report.json)")
        shared = _same_storage(weight, produced)
        readers = [op_name(op) for op in ops if any(binding.name in shared for argument in op.inputs.values()
                                                    for binding in argument.arguments)]
        return sorted(set(readers))
    outputs = sorted({name for _, block in main_blocks(program) for name in block.outputs})
    raise BuildError(f"compression.overrides: match {{role: lm_head}} needs a model output named '{LOGITS}'; "
                     f"this model's outputs: {', '.join(outputs)}",
                     hint="the role finds a decoder's LM head; name the op with match: {name: ...} instead")


def _same_storage(weight: str, produced: dict) -> set[str]:
    """``weight`` and every const stored at the same place in the weight file (a tied table)."""
    value = produced[weight].attributes.get("val")
    if value is None or not value.HasField("blobFileValue"):
        return {weight}
    offset = value.blobFileValue.offset
    return {weight} | {name for name, op in produced.items() if op.type == "const" and "val" in op.attributes
                       and op.attributes["val"].HasField("blobFileValue")
                       and op.attributes["val"].blobFileValue.offset == offset}


def _head_weight(var: str, produced: dict, weights: set) -> str | None:
    """The weight var the projection behind ``var`` reads, following pass-through ops back."""
    for _ in range(32):  # a handful of casts and reshapes at most; never loop forever
        op = produced.get(var)
        if op is None:
            return None
        inputs = {name: [b.name for b in argument.arguments] for name, argument in op.inputs.items()}
        if op.type in _PROJECTIONS:
            for name in ("weight", "y", "x"):
                if inputs.get(name) and inputs[name][0] in weights:
                    return inputs[name][0]
            return None
        if op.type not in _PASS_THROUGH or not inputs.get("x") or inputs["x"][0] in weights:
            return None
        var = inputs["x"][0]
    return None
