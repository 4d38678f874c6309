"""A factory for transformers models built from a ``config.json``, with no hub access."""

from __future__ import annotations

import json
from pathlib import Path


def from_config(config: str, attn_implementation: str = "eager", **overrides):
    """The model class the config's ``architectures`` names (e.g. BertModel), randomly initialised:
    the frontend loads the weights. Eager attention exports to plain ONNX ops."""
    import transformers

    data = json.loads(Path(config).read_text())
    data.update(overrides)
    architectures = data.get("architectures") or []
    if not architectures:
        raise ValueError(f"{Path(config).name} names no architectures")
    model_class = getattr(transformers, architectures[0])
    config_class = model_class.config_class
    model_config = config_class.from_dict(data)
    model_config._attn_implementation = attn_implementation
    return model_class(model_config)
