"""The public names of a Core ML artifact's inputs and outputs.

The contract: an input or output keeps its ONNX name when Core ML accepts it; otherwise it gets
one deterministic sanitised name, recorded as a renaming (ONNX name -> artifact name) in the
package's metadata (:data:`METADATA_KEY`), the lower stage's record and the variant's report.

Core ML takes ``[A-Za-z_][A-Za-z0-9_]*`` minus the words MIL reserves for its types and syntax;
coremltools' ``sanitize_input_output_names`` pass would otherwise rename such a name on its own
(``state`` -> ``state_workaround``) where edgebuild could not see it. Names Core ML accepts are
kept first, so a valid name is never displaced by the sanitised spelling of another; an output
that is also an input (or another output) cannot share its name in Core ML and gets a suffix.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Mapping

from edgebuild_coreml.lowering.context import unique_identifier

METADATA_KEY = "com.edgebuild.tensor_names"  # {"inputs": {onnx: artifact}, "outputs": {...}}, renamed only
# The words coremltools' NameSanitizer rewrites (MIL's type names and keywords); case matters.
MIL_RESERVED = frozenset({
    "any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false", "string", "state",
    "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def accepted(name: str) -> bool:
    """Whether Core ML takes ``name`` as it is."""
    return bool(_IDENTIFIER.fullmatch(name)) and name not in MIL_RESERVED


def why_renamed(name: str) -> str:
    """Why ``name`` could not be kept (the report's wording)."""
    if not name:
        return "empty"
    if name in MIL_RESERVED:
        return "a word MIL reserves"
    if not _IDENTIFIER.fullmatch(name):
        if re.fullmatch(r"[0-9][A-Za-z0-9_]*", name):
            return "starts with a digit"
        return "characters outside A-Z a-z 0-9 _"
    return "taken by another input or output"


def sanitized(name: str, taken: set[str]) -> str:
    """The artifact name for ``name``: a valid identifier, not reserved, not in ``taken`` (then added to it)."""
    base = name
    if base in MIL_RESERVED:
        base += "_"
    chosen = unique_identifier(base, taken | MIL_RESERVED, prefix="v_", empty="value")
    taken.add(chosen)
    return chosen


def artifact_names(inputs: Iterable[str], outputs: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({ONNX input: artifact name}, {ONNX output: artifact name}), every artifact name distinct.

    Names Core ML accepts are kept, in order (inputs first); the others are sanitised after them.
    """
    inputs, outputs = list(inputs), list(outputs)
    taken: set[str] = set()
    kept: dict[tuple[str, str], str] = {}
    for role, name in [("input", n) for n in inputs] + [("output", n) for n in outputs]:
        if accepted(name) and name not in taken:
            kept[role, name] = name
            taken.add(name)
    for role, name in [("input", n) for n in inputs] + [("output", n) for n in outputs]:
        if (role, name) not in kept:
            kept[role, name] = sanitized(name, taken)
    return ({n: kept["input", n] for n in inputs}, {n: kept["output", n] for n in outputs})


def renamings(input_names: Mapping[str, str], output_names: Mapping[str, str]) -> list[dict]:
    """Every renamed input and output as the report lists it: ``{"tensor", "onnx", "artifact", "reason"}``."""
    rows = []
    for role, names in (("input", input_names), ("output", output_names)):
        for onnx_name, artifact_name in names.items():
            if onnx_name == artifact_name:
                continue
            reason = why_renamed(onnx_name)
            if role == "output" and onnx_name in input_names and accepted(onnx_name):
                reason = "also an input of the model, and Core ML names each tensor once"
            rows.append({"tensor": role, "onnx": onnx_name, "artifact": artifact_name, "reason": reason})
    return rows


def metadata_value(input_names: Mapping[str, str], output_names: Mapping[str, str]) -> str | None:
    """The package metadata that lets a runtime take and give ONNX names (None: nothing renamed)."""
    record = {"inputs": {k: v for k, v in input_names.items() if k != v},
              "outputs": {k: v for k, v in output_names.items() if k != v}}
    if not record["inputs"] and not record["outputs"]:
        return None
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def read_metadata(user_defined: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``{"inputs": {onnx: artifact}, "outputs": {onnx: artifact}}`` from a package's metadata (empty maps if none)."""
    try:
        record = json.loads(user_defined.get(METADATA_KEY) or "{}")
    except ValueError:
        record = {}
    return {"inputs": dict(record.get("inputs") or {}), "outputs": dict(record.get("outputs") or {})}
