"""Hugging Face causal LMs as decoders with an explicit KV cache.

A ``transformers`` causal LM keeps its cache in a ``DynamicCache`` object, which an ONNX graph
cannot take. ``CacheIO`` wraps the model so the cache is plain tensors: per layer a past key
and value come in, the model's own ``DynamicCache`` is built around them inside, and the
present key and value (past + the new tokens, along the sequence axis) go out beside the
logits. Every layer gets a full-length cache layer, also for sliding-window layers (Gemma-2):
the window is then applied by the attention mask alone, so ``present`` is always past + new,
as the ONNX decoder layout says. Attention is eager: the plain matmul/softmax the exporter
and the backends handle, softcapping included.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from edgebuild.plugin import BuildError

DEFAULT_FACTORY = "edgebuild_pytorch.causal_lm:from_config"
DEFAULT_CONFIG = "config.json"
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
SYMBOL = re.compile(r"\bs\d+\b")  # torch.export's names for dynamic dims

# Example sizes for torch.export: none of them 0 or 1 (those sizes would be specialised), and
# distinct, so the exporter does not take the past and query lengths for the same dim.
EXAMPLE_BATCH = 2
EXAMPLE_QUERY = 3
EXAMPLE_PAST = 5


def past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"present.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def from_config(config: str, **overrides):
    """The causal LM a ``config.json`` describes (``model_type`` picks the class), randomly
    initialised with eager attention: the caller loads the weights."""
    import transformers

    data = json.loads(Path(config).read_text())
    data.update(overrides)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError(f"{Path(config).name} has no model_type")
    model_config = transformers.AutoConfig.for_model(model_type, **data)
    try:
        return transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="eager")
    except ValueError as exc:
        raise ValueError(f"{Path(config).name}: model_type {model_type!r} has no causal LM class ({exc})") from exc


def cache_shape(model) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of the model's cache."""
    config = model.config.get_text_config(decoder=True)
    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers, kv_heads, head_dim


def takes_position_ids(model) -> bool:
    return POSITION_IDS in inspect.signature(model.forward).parameters


def build_cache(past: list):
    """The model's own ``DynamicCache``, one full-length layer per (key, value) pair, holding ``past``."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache()
    cache.layers = []
    for key, value in zip(past[0::2], past[1::2]):
        layer = DynamicLayer()
        layer.dtype, layer.device = key.dtype, key.device
        layer.keys, layer.values = key, value
        layer.is_initialized = True
        cache.layers.append(layer)
    return cache


def flat_present(cache) -> list:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def cache_io(model):
    """``model`` as ``forward(input_ids, attention_mask[, position_ids], *past) -> (logits, *present)``."""
    import torch

    with_positions = takes_position_ids(model)

    class CacheIO(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            input_ids, attention_mask, *rest = inputs
            position_ids, past = (rest[0], rest[1:]) if with_positions else (None, rest)
            extra = {POSITION_IDS: position_ids} if with_positions else {}
            cache = build_cache(list(past))
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True, **extra)
            return (out.logits, *flat_present(out.past_key_values))

    wrapper = CacheIO()
    wrapper.training = False
    return wrapper


def input_names(model) -> list[str]:
    layers, _, _ = cache_shape(model)
    names = [INPUT_IDS, ATTENTION_MASK] + ([POSITION_IDS] if takes_position_ids(model) else [])
    return names + past_names(layers)


def output_names(model) -> list[str]:
    return [LOGITS] + present_names(cache_shape(model)[0])


def example_inputs(model, *, batch: int = EXAMPLE_BATCH, query: int = EXAMPLE_QUERY, past: int = EXAMPLE_PAST,
                   seed: int = 0) -> tuple:
    """Arguments for ``cache_io(model)``: random token ids, an all-ones mask, positions after the past."""
    import torch

    layers, kv_heads, head_dim = cache_shape(model)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    dtype = next(model.parameters()).dtype
    arguments = [torch.randint(0, vocab, (batch, query), generator=generator),
                 torch.ones(batch, past + query, dtype=torch.int64)]
    if takes_position_ids(model):
        arguments.append(torch.arange(past, past + query, dtype=torch.int64).expand(batch, query).contiguous())
    for _ in range(2 * layers):
        arguments.append(torch.randn(batch, kv_heads, past, head_dim, generator=generator).to(dtype))
    return tuple(arguments)


def dynamic_shapes(model) -> tuple:
    """Batch, query length and past length free; the mask's length is theirs summed, which
    torch.export works out from the graph (``Dim.AUTO``)."""
    from torch.export import Dim

    layers, _, _ = cache_shape(model)
    token_dims = {0: Dim.AUTO, 1: Dim.AUTO}
    shapes = [token_dims, token_dims] + ([token_dims] if takes_position_ids(model) else [])
    shapes += [{0: Dim.AUTO, 2: Dim.AUTO}] * (2 * layers)
    return (tuple(shapes),)  # forward(*inputs): one variadic parameter


def export_program(model):
    """A ``torch.export`` program of ``cache_io(model)`` with dynamic batch, query and past lengths."""
    import torch

    wrapper = cache_io(model)
    with torch.no_grad():
        try:
            return torch.export.export(wrapper, example_inputs(model), dynamic_shapes=dynamic_shapes(model),
                                       strict=False)
        except Exception as exc:
            raise BuildError(
                f"torch.export could not capture the {type(model).__name__} with its KV cache: "
                f"{type(exc).__name__}: {_first_line(exc)}",
                hint="the causal LM route needs eager attention and transformers' DynamicCache",
            ) from exc


def export_onnx(model, path: Path, *, opset: int = 18) -> Path:
    """Write ``model`` as an ONNX decoder at ``path`` (weights in ``<path>.data``) in the
    optimum layout: input_ids, attention_mask[, position_ids], past_key_values.{i}.key/.value
    -> logits, present.{i}.key/.value, with named dynamic dims."""
    from edgebuild_pytorch.onnx_route import save_model

    save_model(export_decoder(model, opset=opset), path)
    return path


def export_decoder(model, *, opset: int = 18, repeat: bool = True):
    """``model`` as an ``onnx_ir`` decoder (the layout of ``export_onnx``), its weights the module's
    own tensors, transposed ones computed when written. A stack of like layers is exported with two of them and
    grown to its depth (edgebuild_pytorch.layer_repeat) unless ``repeat`` is False or the two-layer
    graph does not allow it; then the whole model is exported."""
    from edgebuild_pytorch.layer_repeat import first_layers, layer_list, repeat_layers, repeatable
    from edgebuild_pytorch.onnx_route import export_model

    if repeat and repeatable(model):
        layers = cache_shape(model)[0]
        path = f"model.{layer_list(model)[0]}"  # cache_io's module holds the model as .model
        with first_layers(model):
            onnx_model = export_model(export_program(model), opset=opset, input_names=input_names(model),
                                      output_names=output_names(model))
        parameters = {f"model.{name}": p for name, p in model.named_parameters()}
        if repeat_layers(onnx_model.graph, parameters, layers, path):
            name_dims(onnx_model.graph)
            return onnx_model
    onnx_model = export_model(export_program(model), opset=opset, input_names=input_names(model),
                              output_names=output_names(model))
    name_dims(onnx_model.graph)
    return onnx_model


def name_dims(graph) -> None:
    """Replace the exporter's symbols (s0, s1 + s2, ...) in graph I/O shapes by the layout's names."""
    import onnx_ir as ir

    inputs = {v.name: v for v in graph.inputs}
    ids, mask = inputs[INPUT_IDS].shape, inputs[ATTENTION_MASK].shape
    # The mask's length is past + query, which the exporter may keep as a symbol of its own.
    symbols = {str(mask[0]): "batch", str(mask[1]): "total_length", str(ids[0]): "batch",
               str(ids[1]): "query_length"}
    past = inputs.get("past_key_values.0.key")
    if past is not None:
        symbols[str(past.shape[2])] = "past_length"
    symbols = {k: v for k, v in symbols.items() if SYMBOL.fullmatch(k)}

    def rename(dim):
        if isinstance(dim, int) or dim.value is None:
            return dim
        return ir.SymbolicDim(SYMBOL.sub(lambda m: symbols.get(m.group(0), m.group(0)), dim.value))

    for value in [*graph.inputs, *graph.outputs]:
        if value.shape is not None:
            value.shape = ir.Shape([rename(d) for d in value.shape])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
