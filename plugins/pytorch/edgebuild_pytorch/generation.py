"""Greedy generation with a PyTorch causal LM in eager mode: the reference of a generative recipe.

The model keeps its own cache (``DynamicCache`` built from its config, so Gemma-2's sliding
layers keep only their window), exactly as ``model.generate`` would; the exported decoder and
the artifact are checked against it. The prompt is prefilled in one step, then one token per step.
"""

from __future__ import annotations

import numpy as np

from edgebuild.plugin import Generator, UsageError


class TorchGenerator(Generator):
    """``generate(prompt_ids, new_tokens) -> (tokens, logits [new_tokens, vocab])``, batch 1, greedy."""

    def __init__(self, model):
        self.model = model.eval()

    def generate(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        import torch
        from transformers.cache_utils import DynamicCache

        if not prompt_ids:
            raise UsageError("validate.generation.prompts: a prompt needs at least one token")
        cache = DynamicCache(config=self.model.config)
        ids, position = list(prompt_ids), 0
        tokens, rows = [], []
        with torch.no_grad():
            for _ in range(new_tokens):
                input_ids = torch.tensor([ids], dtype=torch.int64)
                mask = torch.ones(1, position + len(ids), dtype=torch.int64)
                out = self.model(input_ids=input_ids, attention_mask=mask, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                row = out.logits[0, -1].float().numpy()
                tokens.append(int(np.argmax(row)))
                rows.append(row)
                position += len(ids)
                ids = [tokens[-1]]
        vocab = rows[0].shape[-1] if rows else 0
        return tokens, np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
