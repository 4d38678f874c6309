"""The decoder benchmarks/llm.py builds: a Llama-architecture causal LM, randomly initialised from
its config with ``transformers`` (nothing downloaded), saved twice in a cache directory:

- ``pytorch/``: ``config.json`` + ``model.safetensors`` (one file), the PyTorch source;
- ``onnx/``: ``model.onnx`` + ``model.onnx.data``, the decoder with its KV cache as plain inputs and
  outputs (``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/.value`` ->
  ``logits``, ``present.{i}.key/.value``), exported by the pytorch plugin's causal-LM route
  (``edgebuild_pytorch.causal_lm.export_onnx``) with external data: what a stateful ``generate:``
  recipe builds from.

``full`` is TinyLlama-1.1B's shape (22 layers, hidden 2048, intermediate 5632, 32 query / 4 KV heads,
vocab 32000: 1.1 billion parameters, 4.4 GB per form in fp32); ``medium`` the same with 6 layers
(0.4 billion); ``small`` is a 4-layer, hidden-512
model for CI smoke runs. A ``manifest.json`` written last records each file's sha256, size and
mtime; a later run reuses the files only if they still match it (the digests are re-checked when a
file's size or mtime changed), and otherwise makes them again.

    python benchmarks/llm_source.py --size full --cache-dir DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

# Bump when what is generated changes, so old caches are remade rather than trusted.
GENERATOR_VERSION = 2
SEED = 0

SHAPES = {
    "full": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048),
    # TinyLlama's widths with 6 of its 22 layers (0.4 B parameters): the full model's per-weight
    # behaviour where the disk cannot hold the full model's builds (about 21 GB with its sources)
    "medium": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=6,
                   num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048),
    "small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048),
}
COMMON = dict(rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
              attention_bias=False, torch_dtype="float32")
FILES = ("pytorch/config.json", "pytorch/model.safetensors", "onnx/model.onnx", "onnx/model.onnx.data")


def config_dict(size: str) -> dict:
    return {**SHAPES[size], **COMMON}


def parameter_count(size: str) -> int:
    c = config_dict(size)
    hidden, inter, kv = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    per_layer = (2 * hidden * hidden + 2 * hidden * kv * c["num_key_value_heads"] + 3 * hidden * inter
                 + 2 * hidden)
    return c["num_hidden_layers"] * per_layer + 2 * c["vocab_size"] * hidden + hidden


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def verified(root: Path, size: str) -> bool:
    """True if ``root`` holds this generator's files for ``size``, unchanged since they were made."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("generator") != GENERATOR_VERSION or manifest.get("config") != config_dict(size):
        return False
    for name in FILES:
        entry, path = manifest["files"].get(name), root / name
        if entry is None or not path.is_file():
            return False
        if _stat(path) != entry["stat"] and sha256_of(path) != entry["sha256"]:
            return False
    return True



def generate(root: Path, size: str) -> dict:
    """Make (or reuse) the two forms of the ``size`` model under ``root``; {file: path} plus the config."""
    root = Path(root).resolve()
    if not verified(root, size):
        _make(root, size)
    manifest = json.loads((root / "manifest.json").read_text())
    return {"root": str(root), "config": manifest["config"], "parameters": manifest["parameters"],
            **{name: str(root / name) for name in FILES}}


def _make(root: Path, size: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from edgebuild_pytorch.causal_lm import export_onnx

    if root.exists():
        shutil.rmtree(root)  # keep one copy on a limited disk
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "pytorch").mkdir(parents=True)
    (staging / "onnx").mkdir()
    torch.manual_seed(SEED)
    config = LlamaConfig(**config_dict(size))
    with torch.no_grad():
        # eager attention: the causal-LM export's layout (plain matmul / softmax, explicit cache)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        model.save_pretrained(staging / "pytorch", safe_serialization=True, max_shard_size="100GB")
        for extra in ("generation_config.json",):
            (staging / "pytorch" / extra).unlink(missing_ok=True)
        export_onnx(model, staging / "onnx" / "model.onnx")
        del model
    data = staging / "onnx" / "model.onnx.data"
    if not data.is_file():
        raise SystemExit(f"the exporter wrote no {data.name}: {sorted(p.name for p in (staging / 'onnx').iterdir())}")
    manifest = {"generator": GENERATOR_VERSION, "seed": SEED, "config": config_dict(size),
                "parameters": parameter_count(size),
                "files": {name: {"sha256": sha256_of(staging / name), "stat": None} for name in FILES}}
    os.replace(staging, root)
    for name in FILES:
        manifest["files"][name]["stat"] = _stat(root / name)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SHAPES), default="small")
    parser.add_argument("--cache-dir", required=True)
    args = parser.parse_args(argv)
    print(json.dumps(generate(Path(args.cache_dir) / f"llama-{args.size}", args.size), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
