"""Feeding a stateful decoder artifact: the cache position, chunked prefill and greedy decoding.

The artifact (see the recipe's ``generate`` section) takes ``input_ids`` [1, Q] for Q among its
query lengths and ``position`` [1], the number of tokens already in its cache; it returns
``logits`` [1, Q, V] (or [1, 1, V] for ``logits: last_token``). :class:`Decoder` keeps the
position beside the runtime's state object and checks every call against ``max_context``.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from edgebuild.errors import BuildError

INPUT_IDS, POSITION, LOGITS = "input_ids", "position", "logits"


def chunk_lengths(count: int, query_lengths) -> list[int]:
    """Split ``count`` prompt tokens into chunks the artifact accepts: the largest length that
    fits first, down to 1 (which every generative artifact takes)."""
    chunks = []
    if isinstance(query_lengths, Mapping):  # {"range": [lo, hi]}, lo == 1
        high = int(query_lengths["range"][1])
        while count:
            chunks.append(min(high, count))
            count -= chunks[-1]
        return chunks
    lengths = sorted({int(q) for q in query_lengths}, reverse=True)
    while count:
        length = next(q for q in lengths if q <= count)
        chunks.append(length)
        count -= length
    return chunks


def accepts(length: int, query_lengths) -> bool:
    if isinstance(query_lengths, Mapping):
        lo, hi = query_lengths["range"]
        return lo <= length <= hi
    return length in query_lengths


class Decoder:
    """A stateful model (``Runtime.open_stateful``) with the cache position tracked."""

    def __init__(self, model, where: str):
        self.model = model
        self.where = where
        self.generate = model.generate
        self.max_context = int(self.generate["max_context"])
        self.position = 0

    def reset(self) -> None:
        self.model.reset()
        self.position = 0

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict:
        """One call: ``input_ids`` [1, Q] (or [Q]); ``position`` defaults to the tokens cached so far."""
        if INPUT_IDS not in inputs:
            raise BuildError(f"{self.where}: a stateful decoder takes input_ids (and optionally position); "
                             f"got {', '.join(inputs) or 'nothing'}")
        ids = np.asarray(inputs[INPUT_IDS]).astype(np.int32, copy=False).reshape(1, -1)
        position = int(np.asarray(inputs[POSITION]).reshape(-1)[0]) if POSITION in inputs else self.position
        length = ids.shape[1]
        lengths = self.generate["query_lengths"]
        if not accepts(length, lengths):
            raise BuildError(f"{self.where}: {length} tokens in one call; the artifact takes query lengths {lengths}",
                             hint="feed the tokens in chunks of those lengths (generate() does)")
        if position < 0 or position + length > self.max_context:
            raise BuildError(f"{self.where}: tokens {position}..{position + length} do not fit the cache of "
                             f"max_context {self.max_context}",
                             hint="reset() the session, or rebuild with a larger generate.max_context")
        outputs = self.model.run({INPUT_IDS: ids, POSITION: np.array([position], np.int32)})
        self.position = position + length
        return outputs

    def generate_tokens(self, prompt_ids, max_new_tokens: int) -> tuple[list[int], np.ndarray]:
        """Greedy generation from an empty cache: (new tokens, logits [steps, V] of each step)."""
        prompt = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
        if not prompt:
            raise BuildError(f"{self.where}: generate() needs at least one prompt token")
        if max_new_tokens < 0:
            raise BuildError(f"{self.where}: max_new_tokens is {max_new_tokens}; give 0 or more")
        if len(prompt) + max_new_tokens > self.max_context:
            raise BuildError(f"{self.where}: a prompt of {len(prompt)} tokens and {max_new_tokens} new tokens "
                             f"({len(prompt) + max_new_tokens}) exceed max_context {self.max_context}",
                             hint="shorten the prompt or max_new_tokens, or rebuild with a larger generate.max_context")
        self.reset()
        done = 0
        for length in chunk_lengths(len(prompt), self.generate["query_lengths"]):
            last = self._last_logits(self.run({INPUT_IDS: np.array([prompt[done:done + length]])}))
            done += length
        tokens, steps = [], []
        for step in range(max_new_tokens):
            token = int(np.argmax(last))
            tokens.append(token)
            steps.append(last)
            if step + 1 < max_new_tokens:
                last = self._last_logits(self.run({INPUT_IDS: np.array([[token]])}))
        vocab = last.shape[-1]
        return tokens, (np.stack(steps) if steps else np.zeros((0, vocab), np.float32))

    def _last_logits(self, outputs: dict) -> np.ndarray:
        if LOGITS not in outputs:
            raise BuildError(f"{self.where}: the artifact returned no logits (got {', '.join(outputs)})")
        logits = np.asarray(outputs[LOGITS])
        return logits.reshape(-1, logits.shape[-1])[-1].astype(np.float32)
