"""Greedy generation by stepping a source's reference runner with its KV cache explicit.

A frontend whose reference runner evaluates the source as a pure step function (a JAX export:
``input_ids``, ``position`` and the cache in, ``logits`` and the new cache out) needs no generator of
its own: this one feeds the cache inputs zeros of their full length, replaces each by its paired
output after every call, and derives ``position``, ``attention_mask`` and ``position_ids`` from the
tokens already fed. The prompt is fed in the chunks the artifact takes (``chunks``), so both sides
run the same calls.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from edgebuild.errors import BuildError, EdgebuildError, UsageError
from edgebuild.protocols import Generator, Runner

INPUT_IDS, POSITION, ATTENTION_MASK, POSITION_IDS, LOGITS = (
    "input_ids", "position", "attention_mask", "position_ids", "logits")


class RunnerGenerator(Generator):
    """``runner``: the source's reference (a callable on ``{name: array}``, its ``input_specs``
    giving each input's shape and dtype); ``pair``: the cache's (past input, present output) pairs
    from the runner's input and output names; ``chunks``: prompt length -> chunk lengths."""

    def __init__(self, runner: Runner, *, pair: Callable[[list[str], list[str]], list[tuple[str, str]]],
                 chunks: Callable[[int], Sequence[int]], max_context: int, where: str):
        specs = getattr(runner, "input_specs", None)
        if not isinstance(specs, Mapping) or INPUT_IDS not in specs:
            raise BuildError(f"{where}: the source's reference does not say it takes input_ids, so it cannot "
                             "generate", hint="export the decoder step with an input named input_ids "
                                              "(source.options.input_names)")
        self.runner, self.specs, self.where = runner, dict(specs), where
        self.pair, self.chunks, self.max_context = pair, chunks, max_context
        self.cache: Optional[list[tuple[str, str]]] = None  # paired on the first call, from its outputs

    def _empty_cache(self) -> dict[str, np.ndarray]:
        names = [n for n in self.specs if n not in (INPUT_IDS, POSITION, ATTENTION_MASK, POSITION_IDS)]
        past = {}
        for name in names:
            shape = list(self.specs[name]["shape"])
            if len(shape) != 4 or shape[2] != self.max_context:
                raise BuildError(f"{self.where}: input {name!r} has shape {shape}; a cache the source holds "
                                 f"explicitly is [1, kv_heads, max_context ({self.max_context}), head_dim]",
                                 hint="export the step with caches of generate.max_context rows, or pair the "
                                      "inputs with generate.cache")
            past[name] = np.zeros(shape, np.dtype(self.specs[name]["dtype"]))
        return past

    def _integers(self, name: str, values, rank: int | None = None) -> np.ndarray:
        spec = self.specs[name]
        array = np.asarray(values, dtype=np.dtype(spec["dtype"]))
        wanted = len(spec["shape"]) if rank is None else rank
        return array.reshape([1] * (wanted - array.ndim) + list(array.shape)) if array.ndim < wanted else array

    def step(self, ids: list[int], position: int, past: dict) -> tuple[np.ndarray, dict]:
        """One call: logits [Q, V] of ``ids`` after ``position`` cached tokens, and the new cache."""
        feeds = {INPUT_IDS: self._integers(INPUT_IDS, [ids]), **past}
        if POSITION in self.specs:
            feeds[POSITION] = self._integers(POSITION, position)
        if ATTENTION_MASK in self.specs:
            feeds[ATTENTION_MASK] = self._integers(ATTENTION_MASK, [[1] * (position + len(ids))])
        if POSITION_IDS in self.specs:
            feeds[POSITION_IDS] = self._integers(POSITION_IDS, [list(range(position, position + len(ids)))])
        try:
            outputs = self.runner(feeds)
        except EdgebuildError:
            raise
        except Exception as exc:  # the source's own refusal, e.g. a chunk beyond its export's constraint
            raise BuildError(f"{self.where}: the source's step failed on input_ids [1, {len(ids)}] at position "
                             f"{position}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                             hint="keep generate.query_lengths within the lengths the step was exported for "
                                  "(its symbolic query length's constraints), and the prompts plus new_tokens "
                                  "within generate.max_context") from exc
        if LOGITS not in outputs:
            raise BuildError(f"{self.where}: the source's step returned no logits (outputs: {', '.join(outputs)})",
                             hint="name the step's results with source.options.output_names")
        if self.cache is None:
            self.cache = self.pair(list(self.specs), list(outputs))
            unpaired = set(past) - {name for name, _ in self.cache}
            if unpaired:
                raise BuildError(f"{self.where}: input(s) {', '.join(sorted(unpaired))} are neither tokens, "
                                 "position, mask, positions nor a paired cache",
                                 hint="pair them in generate.cache, or fix their names")
        logits = np.asarray(outputs[LOGITS])
        return logits.reshape(-1, logits.shape[-1]), {p: np.asarray(outputs[o]) for p, o in self.cache}

    def generate(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        if not prompt_ids:
            raise UsageError("validate.generation.prompts: a prompt needs at least one token")
        past, position, fed = self._empty_cache(), 0, list(prompt_ids)
        tokens, rows = [], []
        while len(tokens) < new_tokens:
            for length in self.chunks(len(fed)):
                logits, past = self.step(fed[:length], position, past)
                position, fed = position + length, fed[length:]
            row = logits[-1].astype(np.float32)
            tokens.append(int(np.argmax(row)))
            rows.append(row)
            fed = [tokens[-1]]
        vocab = rows[0].shape[-1] if rows else 0
        return tokens, np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
