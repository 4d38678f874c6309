"""The reference side of generation validation: greedy generation with the source decoder.

``OnnxGenerator`` runs an ONNX decoder in onnxruntime with its cache explicit: every step
feeds the past key/value tensors and reads the present ones back. Both decoder layouts work:
the optimum/torch.onnx one (attention_mask [1, P+Q], optional position_ids) and
onnxruntime-genai's (GroupQueryAttention derives its sequence lengths from the same mask).
A cache input of fixed length is a whole-length cache the decoder writes at its ``position``
input itself: it starts as zeros of that length. A prompt is prefilled in one step (a token a
step when ``input_ids`` takes one token), then one token per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from edgebuild.errors import BuildError, UsageError
from edgebuild.protocols import Generator

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
POSITION = "position"  # tokens already cached, for a decoder with a whole-length cache
LOGITS = "logits"
PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
GENAI_CONFIG = "genai_config.json"  # onnxruntime-genai's builder writes it beside the model

ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
             "tensor(float16)": np.float16, "tensor(bfloat16)": np.float32, "tensor(double)": np.float64}


def pair_cache(input_names: Sequence[str], output_names: Sequence[str]) -> list[tuple[str, str]]:
    """``cache: auto``: each ``past_key_values.X`` input with the ``present.X`` output."""
    outputs = set(output_names)
    pairs = []
    for name in input_names:
        if not name.startswith(PAST_PREFIX):
            continue
        present = PRESENT_PREFIX + name[len(PAST_PREFIX):]
        if present not in outputs:
            raise BuildError(f"cache input {name!r} has no output {present!r} to pair with",
                             hint="give generate.cache as an explicit list of {input, output} pairs")
        pairs.append((name, present))
    return pairs


class OnnxGenerator(Generator):
    """Greedy generation with an ONNX decoder (batch 1) in onnxruntime.

    ``cache``: (past input, present output) name pairs; default: paired by name (``pair_cache``).
    ``head_dim``: the cache's last dim when the graph leaves it symbolic and no genai_config.json
    beside the model gives it (only an empty first past needs it).
    """

    def __init__(self, model_path: Path | str, *, cache: Optional[Sequence[tuple[str, str]]] = None,
                 head_dim: Optional[int] = None, threads: Optional[int] = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise BuildError("generation validation needs onnxruntime for the reference: pip install onnxruntime") from None
        self.path = Path(model_path)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        for required, where in ((INPUT_IDS, self.inputs), (LOGITS, self.output_names)):
            if required not in where:
                raise BuildError(f"{self.path.name}: a decoder needs {'an input' if where is self.inputs else 'an output'} "
                                 f"named {required!r}", hint="export the decoder in the optimum or onnxruntime-genai layout")
        self.cache = list(cache) if cache is not None else pair_cache(list(self.inputs), self.output_names)
        for past, present in self.cache:
            if past not in self.inputs or present not in self.output_names:
                raise UsageError(f"generate.cache: {self.path.name} has no input {past!r} or no output {present!r}")
        self.empty_past = {past: self._empty(past, head_dim) for past, _ in self.cache}
        unknown = set(self.inputs) - {INPUT_IDS, ATTENTION_MASK, POSITION_IDS, POSITION} - set(self.empty_past)
        if unknown:
            raise BuildError(f"{self.path.name}: decoder input(s) {', '.join(sorted(unknown))} are neither tokens, "
                             "mask, positions nor cache", hint="pair them in generate.cache, or fix their names")

    def _empty(self, name: str, head_dim: Optional[int]) -> np.ndarray:
        """A past of length 0: [1, heads, 0, head_dim]; a whole-length cache's zeros."""
        spec = self.inputs[name]
        shape = list(spec.shape)
        if len(shape) != 4:
            raise BuildError(f"{self.path.name}: cache input {name!r} has shape {shape}, expected [batch, heads, past, head_dim]")
        heads, dim = shape[1], shape[3]
        if not isinstance(dim, int):
            dim = head_dim or _genai_head_size(self.path)
        if not isinstance(heads, int) or not isinstance(dim, int):
            raise BuildError(f"{self.path.name}: cache input {name!r} has symbolic heads or head dim ({shape})",
                             hint="pass head_dim, or pin the dims in the graph")
        length = shape[2] if isinstance(shape[2], int) else 0
        return np.zeros((1, heads, length, dim), dtype=ORT_TYPES.get(spec.type, np.float32))

    def _integer(self, name: str, values) -> np.ndarray:
        return np.asarray(values, dtype=ORT_TYPES.get(self.inputs[name].type, np.int64))[None]

    def _prefill(self, ids: list[int], past: dict) -> tuple[np.ndarray, dict]:
        """The prompt in one run, or one token a run for a decoder whose ``input_ids`` is [1, 1]."""
        if self.inputs[INPUT_IDS].shape[-1] != 1:
            return self.step(ids, 0, past)
        for position, token in enumerate(ids):
            logits, past = self.step([token], position, past)
        return logits, past

    def step(self, ids: list[int], position: int, past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
        """One run: logits [Q, V] of the ``ids`` after ``position`` cached tokens, and the new past."""
        feeds = {INPUT_IDS: self._integer(INPUT_IDS, ids), **past}
        if ATTENTION_MASK in self.inputs:
            feeds[ATTENTION_MASK] = self._integer(ATTENTION_MASK, [1] * (position + len(ids)))
        if POSITION_IDS in self.inputs:
            feeds[POSITION_IDS] = self._integer(POSITION_IDS, range(position, position + len(ids)))
        if POSITION in self.inputs:  # 0-d or [1]
            feeds[POSITION] = self._integer(POSITION, position).reshape([1] * len(self.inputs[POSITION].shape))
        outputs = dict(zip(self.output_names, self.session.run(None, feeds)))
        return outputs[LOGITS][0], {past_name: outputs[present] for past_name, present in self.cache}

    def generate(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        if not prompt_ids:
            raise UsageError("validate.generation.prompts: a prompt needs at least one token")
        past = dict(self.empty_past)
        ids, position = list(prompt_ids), 0
        tokens, rows = [], []
        for _ in range(new_tokens):
            logits, past = self._prefill(ids, past) if position == 0 else self.step(ids, position, past)
            row = logits[-1].astype(np.float32)
            tokens.append(int(np.argmax(row)))
            rows.append(row)
            position += len(ids)
            ids = [tokens[-1]]
        vocab = rows[0].shape[-1] if rows else 0
        return tokens, np.stack(rows) if rows else np.zeros((0, vocab), np.float32)


def _genai_head_size(model_path: Path) -> Optional[int]:
    config = model_path.parent / GENAI_CONFIG
    if not config.is_file():
        return None
    try:
        return int(json.loads(config.read_text())["model"]["decoder"]["head_size"])
    except (KeyError, TypeError, ValueError):
        return None
