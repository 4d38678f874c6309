"""A factory for transformers encoders built from a ``config.json``, with no hub access."""

from __future__ import annotations

import json
from pathlib import Path

# BERT's original padding penalty: finite in fp16, and exp(-10000) is exactly 0 in fp32 too.
PADDING_PENALTY = -10000.0


class _AdditiveMask:
    """Mixin: takes the usual 0/1 ``attention_mask`` and hands the model BERT's additive
    ``[batch, 1, 1, seq]`` mask. transformers' own mask builder indexes a boolean tensor
    (ONNX GatherND on bool) and fills with float32's minimum, which overflows in fp16; the
    additive mask is the same attention as plain arithmetic."""

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        import torch

        keep = attention_mask[:, None, None, :].to(torch.float32)
        additive = (1.0 - keep) * PADDING_PENALTY
        return super().forward(input_ids=input_ids, attention_mask=additive, token_type_ids=token_type_ids)


def from_config(config: str, attn_implementation: str = "eager", mask: str = "additive", **overrides):
    """The model class the config's ``architectures`` names (e.g. BertModel), randomly initialised:
    the frontend loads the weights. Parameter names are the model class's own, so its
    checkpoints load as saved. ``mask: transformers`` keeps the library's mask handling."""
    import transformers

    data = json.loads(Path(config).read_text())
    data.update(overrides)
    architectures = data.get("architectures") or []
    if not architectures:
        raise ValueError(f"{Path(config).name} names no architectures")
    if mask not in ("additive", "transformers"):
        raise ValueError(f"mask must be 'additive' or 'transformers', not {mask!r}")
    model_class = getattr(transformers, architectures[0])
    model_config = model_class.config_class.from_dict(data)
    model_config._attn_implementation = attn_implementation
    if mask == "additive":
        model_class = type(f"{model_class.__name__}AdditiveMask", (_AdditiveMask, model_class), {})
    return model_class(model_config)
