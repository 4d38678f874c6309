"""Tiny random-weight decoders of five transformers families, as checkpoints and ONNX decoders.

Each family is its published config shrunk to 2 layers, hidden 64 and a small vocabulary,
with seeded random weights. ``checkpoint(family)`` writes it with transformers'
``save_pretrained`` (config.json + model.safetensors); ``onnx_decoder(family)`` exports it with
the PyTorch plugin (optimum layout); ``genai_decoder(family)`` runs onnxruntime-genai's model
builder on the checkpoint (GroupQueryAttention layout). Everything is made once per process in
a temporary directory. torch, transformers and the plugin are imported on use: the core's
tests import this package without them.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 0

_SHRUNK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}

CONFIGS: dict[str, dict] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_SHRUNK, "rope_theta": 10000.0,
              "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **_SHRUNK, "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-6, "vocab_size": 320, "bos_token_id": 1, "eos_token_id": 2},
    # Phi-3-mini-4k: original and extended context equal (no LongRoPE scaling).
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **_SHRUNK, "rms_norm_eps": 1e-5,
             "original_max_position_embeddings": 256,
             "vocab_size": 384, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
    # Gemma-2: logit softcapping (attention and final) and a sliding window shorter than the tests'
    # sequences, so windowed and global layers differ.
    "gemma2": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], **_SHRUNK, "head_dim": 16,
               "sliding_window": 8, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "query_pre_attn_scalar": 16, "vocab_size": 448, "bos_token_id": 2, "eos_token_id": 1,
               "pad_token_id": 0},
    # GPT-2: learned positions, fused QKV (Conv1D), tied output projection.
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
             "n_inner": 128, "vocab_size": 512, "n_positions": 256, "bos_token_id": 1, "eos_token_id": 2},
}
FAMILIES = tuple(CONFIGS)
GENAI_FAMILIES = ("llama", "qwen2", "phi3")  # onnxruntime-genai's builder supports these and we test them


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="edgebuild-llm-families-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def model(family: str):
    """The family's causal LM with seeded random weights and eager attention, in eval mode."""
    import torch
    import transformers

    data = dict(CONFIGS[family])
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    torch.manual_seed(SEED)
    lm = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # the default init leaves norms at 1 and biases at 0: perturb so they matter
        for name, parameter in lm.named_parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return lm.eval()


@functools.cache
def checkpoint(family: str) -> Path:
    """A directory with the family's config.json and model.safetensors."""
    out = _workdir() / family / "checkpoint"
    lm = model(family)
    lm.save_pretrained(out, safe_serialization=True)
    tokenizer(lm.config).save_pretrained(out)  # onnxruntime-genai's builder reads one
    return out


def tokenizer(config):
    """A word-level tokenizer over the model's whole vocabulary (``t<id>``), with its special tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    special = {config.bos_token_id: "<s>", config.eos_token_id: "</s>"}
    pad = getattr(config, "pad_token_id", None)
    if pad is not None:
        special.setdefault(pad, "<pad>")
    names = [special.get(i, f"t{i}") for i in range(config.vocab_size)]
    backend = Tokenizer(WordLevel({name: i for i, name in enumerate(names)}, unk_token=names[0]))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token=names[0],
                                   pad_token=names[pad] if pad is not None else None)


@functools.cache
def onnx_decoder(family: str) -> Path:
    """The checkpoint exported by the PyTorch plugin: ``model.onnx`` in the optimum layout."""
    from edgebuild_pytorch.causal_lm import export_onnx
    from edgebuild_pytorch.loading import load_source
    from edgebuild_pytorch.options import PyTorchOptions

    weights = checkpoint(family) / "model.safetensors"
    loaded = load_source(weights, PyTorchOptions(kind="causal_lm"))
    return export_onnx(loaded.module, _workdir() / family / "optimum" / "model.onnx")


@functools.cache
def genai_decoder(family: str, precision: str = "fp32") -> Path:
    """onnxruntime-genai's model builder on the checkpoint (``precision`` fp32 or int4, CPU):
    ``model.onnx`` with GroupQueryAttention (rotary embedding inside it, on CPU),
    SkipSimplifiedLayerNormalization and, for int4, MatMulNBits."""
    out = _workdir() / family / f"genai-{precision}"
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint(family)),
               "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(_workdir() / family / "genai-cache")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (out / "model.onnx").is_file():
        raise RuntimeError(f"onnxruntime-genai's builder failed on {family} ({precision}):\n{done.stderr[-3000:]}")
    return out / "model.onnx"
