"""From a model's facts to the choices a first recipe makes: pinned shapes, fixed branch
selectors and validation input generators, each with the reason a comment will give."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edgebuild.errors import UsageError
from edgebuild.start.probe import InputFacts, ModelFacts

BATCH = 1
SEQUENCE = 128  # tokens; capped by the position table when the graph has one
IMAGE_SIDE = 224
OTHER = 512  # a dynamic dim the graph says nothing about; the onnxruntime check may try 1 instead
COMPANIONS = ("attention_mask", "token_type_ids")  # follow the token input (see verify/inputs.py)
_BATCH_NAMES = re.compile(r"batch|^n$|^b$|^N$|^B$|DynamicDimension\.0$", re.IGNORECASE)
_SEQUENCE_NAMES = re.compile(r"seq|len|token|time|step|position", re.IGNORECASE)


@dataclass
class InputChoice:
    facts: InputFacts
    shape: list[int] | None = None
    value: Any = None  # a fixed value, folded at build time
    generator: dict | None = None  # the validate.inputs entry; None: left to the default
    source_notes: list[str] = field(default_factory=list)
    validate_note: str = ""
    unknown_axes: list[int] = field(default_factory=list)  # pinned to OTHER without evidence

    @property
    def name(self) -> str:
        return self.facts.name


@dataclass
class Suggestion:
    name: str
    inputs: list[InputChoice]
    tokens: str | None = None
    notes: list[str] = field(default_factory=list)


def recipe_name(stem: str) -> str:
    """A valid recipe name (``^[A-Za-z0-9][A-Za-z0-9_.-]*$``) from a file stem."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_.-")
    return name if name and name[0].isalnum() else f"model_{name}".rstrip("_")


def suggest(facts: ModelFacts, name: str) -> Suggestion:
    tokens = max((f for f in facts.inputs if f.is_integer and f.table), key=lambda f: f.table.rows, default=None)
    choices = [InputChoice(f) for f in facts.inputs]
    pins: dict[str, int] = {}  # symbolic dim name -> the size chosen for it, shared across inputs
    for choice in choices:
        f = choice.facts
        if f.dims is None:
            raise UsageError(
                f"{facts.path.name}: input {f.name!r} has no shape in the model, so init cannot pin it",
                hint="run onnx shape inference on the model, or write source.inputs by hand",
            )
        related = tokens is not None and f.is_integer and f.dims == tokens.dims
        choice.shape = [_pin(choice, axis, dim, pins, related, facts) for axis, dim in enumerate(f.dims)]
    for choice in choices:
        _choose_generator(choice, tokens)
    suggestion = Suggestion(name, choices, tokens.name if tokens else None)
    if tokens is not None:
        suggestion.notes.append(
            f"{tokens.name} indexes the {tokens.table.rows} x {tokens.table.width} table {tokens.table.name!r}: "
            f"a vocabulary of {tokens.table.rows} tokens"
        )
    return suggestion


def _pin(choice: InputChoice, axis: int, dim, pins: dict, token_like: bool, facts: ModelFacts) -> int:
    if isinstance(dim, int):
        return dim
    f = choice.facts
    label = f"'{dim}'" if dim else "unnamed"
    if dim and dim in pins:
        return pins[dim]
    if axis == 0 and len(f.dims) >= 2 or (dim and _BATCH_NAMES.search(dim)):
        size, why = BATCH, "batch"
    elif token_like and axis == len(f.dims) - 1:
        size = min(SEQUENCE, facts.max_positions or SEQUENCE)
        most = facts.max_positions or 512
        why = f"sequence length; for flexible lengths write {{range: [1, {most}], default: {size}}}"
        if facts.max_positions:
            why += f" (the position table has {facts.max_positions} rows)"
    elif f.image_layout and axis in ((2, 3) if f.image_layout == "nchw" else (1, 2)):
        size, why = IMAGE_SIDE, f"image side; for several sizes write {{enumerated: [{IMAGE_SIDE}, 320, 448]}}"
    elif dim and _SEQUENCE_NAMES.search(dim):
        size, why = SEQUENCE, f"sequence length; for flexible lengths write {{range: [1, 512], default: {SEQUENCE}}}"
    else:
        size, why = OTHER, "the graph does not say; set the size your data has"
        choice.unknown_axes.append(axis)
    if dim:
        pins[dim] = size
    choice.source_notes.append(f"dim {axis} ({label}) is dynamic: pinned to {size} ({why})")
    return size


def _choose_generator(choice: InputChoice, tokens: InputFacts | None) -> None:
    f = choice.facts
    seed = 0
    if f.branch_values:
        choice.value = f.branch_values[0]
        others = ", ".join(map(str, f.branch_values[1:]))
        choice.source_notes = [
            f"a scalar that selects a branch ({f.branch_op}): fixed to {choice.value} and folded at build time"
            + (f"; the graph also compares it with {others}" if others else "")
        ]
        return
    if tokens is not None and f.name == tokens.name:
        choice.generator = {"tokens": {"vocab_size": f.table.rows, "seed": seed}}
        choice.validate_note = (f"token ids below the vocabulary size read from {f.table.name!r}; "
                                "add special: {first: CLS id, last: SEP id} if your tokenizer wraps sequences")
        return
    if tokens is not None and f.name in COMPANIONS and f.is_integer and f.dims == tokens.dims:
        what = "ones on real tokens, zeros on padding" if f.name == "attention_mask" else "zeros"
        choice.validate_note = f"{f.name} follows {tokens.name}: {what}"
        return
    if f.is_integer:
        if f.int_range is not None:
            low, high = f.int_range
            choice.generator = {"random": {"low": low, "high": high, "seed": seed}}
            choice.validate_note = f"integers in [{low}, {high}): {f.range_reason}"
        elif "mask" in f.name.lower():
            choice.generator = {"random": {"low": 0, "high": 2, "seed": seed}}
            choice.validate_note = "a mask (by its name): 0 or 1"
        else:
            choice.generator = {"random": {"low": 0, "high": 2, "seed": seed}}
            choice.validate_note = "CHECK: the graph does not show this input's valid range; 0 or 1 for now"
        return
    if f.dtype == "bool":
        choice.generator = {"random": {"seed": seed}}
        choice.validate_note = "true or false, evenly"
        return
    if f.image_layout:
        channels = choice.shape[1] if f.image_layout == "nchw" else choice.shape[3]
        choice.generator = {"random": {"low": 0.0, "high": 1.0, "seed": seed}}
        choice.validate_note = (f"image-like ({f.image_layout.upper()}, {channels} channels): pixels in [0, 1]; "
                                "for real images: images: {dir: samples/, mean: [...], std: [...]}")
        return
    choice.generator = {"random": {"low": -1.0, "high": 1.0, "seed": seed}}
    choice.validate_note = "the graph shows no range: uniform in [-1, 1); set the range your data has"
