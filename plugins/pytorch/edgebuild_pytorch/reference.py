"""The validation reference for a PyTorch source: the original module, in eager mode.

Each call runs a fresh copy of the module, so a stateful TorchScript (an RNN keeping its
state between calls) answers every sample from the same start state the build captured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from edgebuild_pytorch.capture import call_module, output_names
from edgebuild_pytorch.loading import load_source
from edgebuild_pytorch.options import PyTorchOptions, parse_options

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def reference_runner(path: Path, options: PyTorchOptions | dict | None = None, base_dir: Path | None = None) -> Runner:
    """``runner(inputs) -> {output name: array}``; ``inputs`` holds every recipe input, fixed ones included."""
    from torch.utils import _pytree as pytree

    parsed = parse_options(options)
    loaded = load_source(Path(path), parsed, base_dir)
    first = [True]

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        module = loaded.module if first[0] else loaded.fresh()
        first[0] = False
        outputs = call_module(module, dict(inputs), loaded.positional)
        names = output_names(outputs, parsed.output_names)
        leaves = pytree.tree_leaves(outputs)
        return {name: leaf.detach().cpu().numpy() for name, leaf in zip(names, leaves)}

    return run


def reference_generator(path: Path, options: PyTorchOptions | dict | None = None, base_dir: Path | None = None):
    """Greedy generation with the source (kind causal_lm: the eager model and its own cache), or
    None for a source that is not a causal LM."""
    from edgebuild_pytorch.generation import TorchGenerator
    from edgebuild_pytorch.loading import source_kind

    parsed = parse_options(options)
    if source_kind(Path(path), parsed) != "causal_lm":
        return None
    return TorchGenerator(load_source(Path(path), parsed, base_dir).module)
