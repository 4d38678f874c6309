"""Make the checkpoint ``recipes/tiny_llama.yaml`` builds: a Llama with transformers' published
architecture (``LlamaConfig``) shrunk to 2 layers, hidden 64 and a 256-token vocabulary, with
seeded random weights. Nothing is downloaded. Writes ``config.json`` and ``model.safetensors``
(0.4 MB) with ``save_pretrained``; the committed ``recipes/models/tiny_llama/`` is its output
(the same bytes again with the transformers that
constraints/newest.txt pins), so the recipe validates and builds on a fresh clone as well:

    python recipes/models/make_tiny_llama.py            # into recipes/models/tiny_llama/
    python recipes/models/make_tiny_llama.py --out DIR

Needs torch and transformers (in ``make test-env``'s .venv-test; or
``pip install torch transformers``). A random-weight model gives nearly flat logits, so its
generated text means nothing: the example shows the build, not a language model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "tiny_llama"
SEED = 0


def tiny_llama(seed: int = SEED):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"directory to write (default: {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    tiny_llama(args.seed).save_pretrained(args.out, safe_serialization=True)
    print(f"wrote {args.out}/config.json and model.safetensors")


if __name__ == "__main__":
    main()
