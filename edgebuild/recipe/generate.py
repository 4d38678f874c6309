"""The recipe's ``generate:`` section: a decoder built as a stateful artifact whose KV cache lives
in the artifact's states, fed one chunk of tokens at a time.

The section says how long the cache is (``max_context``), which chunk lengths the artifact takes
(``query_lengths``), which logits it returns, and which source inputs and outputs are the cache
(``cache``). Pairing cache inputs with outputs by name (:func:`cache_pairs`) lives here so the
recipe checks and the backend's lowering agree on it.
"""

from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgebuild.errors import RecipeError

# Deployment targets whose Core ML has model states (ct.StateType, iOS18 / macOS15 and later).
STATEFUL_TARGETS = ("iOS18", "iOS26", "macOS15", "macOS26")
MAX_CONTEXT = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)  # as model.Strict


class QueryRange(_Strict):
    """Any chunk length in ``[lo, hi]`` (a range dim on ``input_ids``)."""

    range: tuple[int, int] = Field(description="[lo, hi], 1 <= lo <= hi")

    @field_validator("range")
    @classmethod
    def _ordered(cls, value):
        lo, hi = value
        if lo < 1:
            raise ValueError(f"the range starts at {lo}; query lengths are at least 1")
        if lo > hi:
            raise ValueError(f"the range [{lo}, {hi}] is reversed; write [{hi}, {lo}]")
        return value


class CachePair(_Strict):
    """One cache tensor: the source input that takes the past rows and the output that returns them
    with the new rows appended (along axis 2)."""

    input: str = Field(min_length=1, description="the source's past input, e.g. past_key_values.0.key")
    output: str = Field(min_length=1, description="the source's present output, e.g. present.0.key")


class GenerateSection(_Strict):
    """A decoder built as a stateful artifact (Core ML states, iOS18+): its inputs are ``input_ids``
    [1, Q] and ``position`` [1], the KV cache is kept in one state per cache pair, and attention
    mask and position ids are derived inside from ``position``. The states are float16, the only
    state dtype Core ML (and coremltools 9) accepts: a float32 variant computes in float32 and
    rounds only the cached keys and values to float16."""

    max_context: int = Field(ge=1, le=MAX_CONTEXT, description="tokens the cache holds")
    query_lengths: Union[list[int], QueryRange] = Field(
        default=[1], description="chunk lengths the artifact accepts: a list (enumerated shapes) or "
                                 "{range: [lo, hi]}; must include 1 (decoding feeds one token)")
    logits: Literal["last_token", "all"] = Field(
        default="all", description="all: logits of every fed token [1, Q, V]; last_token: of the last only [1, 1, V]")
    cache: Union[Literal["auto"], list[CachePair]] = Field(
        default="auto", description="auto: pair past_key_values.* inputs with present.* outputs (also "
                                    "past_key.N/past_value.N with present_key.N/present_value.N); or "
                                    "the explicit list of {input, output} pairs")

    @field_validator("query_lengths")
    @classmethod
    def _lengths(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("give at least one query length (1 is required)")
            if any(length < 1 for length in value):
                raise ValueError(f"query lengths are at least 1, got {sorted(value)}")
            if len(set(value)) != len(value):
                raise ValueError(f"a query length is listed twice: {value}")
        return value

    @model_validator(mode="after")
    def _fits(self):
        if 1 not in self.lengths():  # for a range, its lower end
            raise ValueError(f"query_lengths must include 1 (decoding feeds one token at a time); got {self.describe_lengths()}")
        if self.longest_query > self.max_context:
            raise ValueError(f"query length {self.longest_query} exceeds max_context {self.max_context}")
        return self

    @property
    def longest_query(self) -> int:
        return self.query_lengths.range[1] if isinstance(self.query_lengths, QueryRange) else max(self.query_lengths)

    def lengths(self) -> list[int]:
        """The enumerated lengths, largest first; for a range, its two ends."""
        if isinstance(self.query_lengths, QueryRange):
            return sorted(set(self.query_lengths.range), reverse=True)
        return sorted(self.query_lengths, reverse=True)

    def describe_lengths(self):
        if isinstance(self.query_lengths, QueryRange):
            return {"range": list(self.query_lengths.range)}
        return sorted(self.query_lengths)


# -- which inputs and outputs are the cache ------------------------------------------------
# (past input pattern, the present output it pairs with): optimum/onnxruntime-genai, then
# the per-tensor spellings some exporters use.
_AUTO_RULES = (
    (re.compile(r"^past_key_values\.(\d+)\.(key|value)$"), "present.{0}.{1}"),
    (re.compile(r"^past_key_values_(\d+)_(key|value)$"), "present_{0}_{1}"),
    (re.compile(r"^past_(key|value)[._](\d+)$"), None),  # past_key.N -> present_key.N (same separator)
    (re.compile(r"^past\.(\d+)\.(key|value)$"), "present.{0}.{1}"),
)


def _auto_output(name: str) -> str | None:
    for pattern, template in _AUTO_RULES:
        match = pattern.match(name)
        if match is None:
            continue
        if template is None:
            return "present" + name[len("past"):]
        return template.format(*match.groups())
    return None


def cache_pairs(section: GenerateSection, inputs: list[str], outputs: list[str]) -> list[tuple[str, str]]:
    """[(past input, present output)] of the source graph, in the graph's input order.

    Raises RecipeError (with ``path`` into the ``generate`` section) naming the wrong name and the
    graph's inputs or outputs."""
    if section.cache == "auto":
        pairs = []
        for name in inputs:
            present = _auto_output(name)
            if present is None:
                continue
            if present not in outputs:
                raise RecipeError(
                    f"cache: auto pairs input {name!r} with output {present!r}, which the model does not have "
                    f"(outputs: {', '.join(outputs)})", path=("generate", "cache"),
                    hint="list the pairs: cache: [{input: NAME, output: NAME}, ...]")
            pairs.append((name, present))
        if not pairs:
            raise RecipeError(
                f"cache: auto found no past_key_values.* (or past_key.N / past_value.N) inputs; the model's "
                f"inputs are {', '.join(inputs)}", path=("generate", "cache"),
                hint="export the decoder with its KV cache as inputs and outputs, or list the pairs: "
                     "cache: [{input: NAME, output: NAME}, ...]")
        return pairs
    pairs = []
    for index, pair in enumerate(section.cache):
        if pair.input not in inputs:
            raise RecipeError(f"the model has no input {pair.input!r}; its inputs are {', '.join(inputs)}",
                              path=("generate", "cache", index, "input"))
        if pair.output not in outputs:
            raise RecipeError(f"the model has no output {pair.output!r}; its outputs are {', '.join(outputs)}",
                              path=("generate", "cache", index, "output"))
        pairs.append((pair.input, pair.output))
    taken = [name for name, _ in pairs]
    twice = sorted({name for name in taken if taken.count(name) > 1})
    if twice:
        raise RecipeError(f"input(s) {', '.join(twice)} are listed in more than one cache pair",
                          path=("generate", "cache"))
    return pairs


def check_generate(recipe, inputs: Optional[list[str]], outputs: Optional[list[str]]) -> None:
    """The generate section against the rest of the recipe and (when read) the source's names.

    Raises RecipeError with ``path``; the caller adds file:line."""
    section = recipe.generate
    if section is None:
        return
    target = recipe.target.deployment_target
    if target not in STATEFUL_TARGETS:
        raise RecipeError(
            f"a recipe with a generate section builds a stateful model, which needs iOS18 or later; "
            f"target.deployment_target is {target}", path=("target", "deployment_target"),
            hint="set target.deployment_target: iOS18 (or macOS15), or remove the generate section")
    owned = {"input_ids", *DERIVED_INPUTS}
    if inputs is not None and outputs is not None:
        pairs = cache_pairs(section, inputs, outputs)
        owned |= {name for name, _ in pairs}
    for name in recipe.source.inputs:
        if name in owned:  # pinning it would fix the chunk length Q or the cache length P
            raise RecipeError(
                f"a generative recipe sizes {name!r} itself (generate.query_lengths, generate.max_context); "
                "leave it out of source.inputs", path=("source", "inputs", name),
                hint="the artifact takes input_ids [1, Q] and position [1]; the cache, attention_mask and "
                     "position_ids are fed inside it")
    if inputs is not None and outputs is not None:
        if "input_ids" not in inputs:
            raise RecipeError(f"a generative model takes input_ids; the model's inputs are {', '.join(inputs)}",
                              path=("generate",))
        fed = {name for name, _ in pairs} | set(DERIVED_INPUTS) | {"input_ids"}
        unknown = [name for name in inputs if name not in fed and name not in recipe.source.inputs]
        if unknown:
            raise RecipeError(
                f"the model's input(s) {', '.join(unknown)} are neither input_ids, a cache input nor one "
                f"edgebuild derives ({', '.join(DERIVED_INPUTS)})", path=("generate",),
                hint="fix them with source.inputs.NAME.value, or list the cache pairs under generate.cache")


# Inputs the stateful artifact computes from ``position`` and the chunk length (``position``
# itself: a decoder that writes its whole-length cache at the position it is given).
DERIVED_INPUTS = ("attention_mask", "position_ids", "seqlens_k", "total_sequence_length", "position")


# The field a derived input's size comes from, named in messages about it.
SIZED_BY = "generate.query_lengths"


def derived_input_sizes(section: GenerateSection, *, lengths_given: bool = True) -> dict[str, dict]:
    """``source.inputs``-style entries for the inputs a generative artifact feeds the source, for a
    frontend that sizes a source's symbolic dims from the recipe (a StableHLO step exported with a
    symbolic query length): ``input_ids`` [1, Q], Q from ``query_lengths`` (a size, an enumeration or
    a range). ``lengths_given`` False (the recipe left ``query_lengths`` at its default): no size,
    so a symbolic Q is refused naming the field rather than built for one token a call.
    ``position`` is the source's own 0-d or [1], which the artifact's [1] feeds either way."""
    entry: dict = {"sized_by": SIZED_BY}
    if lengths_given:
        lengths = section.query_lengths
        if isinstance(lengths, QueryRange):
            lo, hi = lengths.range
            query = lo if lo == hi else {"range": [lo, hi]}
        else:
            query = lengths[0] if len(lengths) == 1 else {"enumerated": sorted(lengths)}
        entry["shape"] = [1, query]
    return {"input_ids": entry}


def describe(section: GenerateSection, pairs: list[tuple[str, str]], states: dict[str, str]) -> dict:
    """The artifact's ``edgebuild.generate`` metadata: what a runtime needs without the recipe."""
    return {
        "max_context": section.max_context,
        "query_lengths": section.describe_lengths(),
        "logits": section.logits,
        "states": [{"name": states[past], "input": past, "output": present} for past, present in pairs],
    }
