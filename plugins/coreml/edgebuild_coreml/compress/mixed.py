"""Compress each stored weight with its own mode, addressed by the name of its const.

Recipe overrides name compute ops, and coremltools refuses a const shared by ops with
different configurations — which lowered programs have all the time (one deduplicated zero
bias feeding every linear). Keying coremltools' ``op_name_configs`` by the const itself
sidesteps that and compresses exactly the weights chosen, nothing that merely shares an op.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import coremltools as ct

from .config import LinearWeights
from .passes import PASS_ORDER, WeightPass, pass_weights
from .program import load_program, weight_uses
from .report import weight_report
from .selection import WeightSelection
from .spec_linear import quantize_package
from .spec_palettize import NotEditable


def compress_per_const(src: Path, dst: Path, modes: Mapping[str, object], *, weight_threshold: int) -> dict:
    """Write ``dst`` with each const named in ``modes`` compressed by its weights config.

    ``modes`` maps const op names to PalettizeWeights / LinearWeights; every other weight stays
    as stored. Returns the same report as ``compress_mlpackage``.
    """
    if modes and all(isinstance(weights, LinearWeights) for weights in modes.values()):
        try:  # streamed, one tensor at a time
            before, after = quantize_package(src, dst, modes, weight_threshold=max(weight_threshold - 1, 0))
            return weight_report(before, after)
        except NotEditable:
            pass  # before iOS18, or a weight coremltools' pass must decide
    model = ct.models.MLModel(str(src), skip_model_load=True)
    before = weight_uses(load_program(model))
    threshold = max(weight_threshold - 1, 0)  # coremltools compresses sizes > threshold
    passes = {kind: WeightPass(kind, WeightSelection(), threshold) for kind in PASS_ORDER}
    for const_name, weights in modes.items():
        for kind, weight_pass in passes.items():
            part = pass_weights(kind, weights)
            if part is not None:
                weight_pass.selection.by_name[const_name] = part
    for weight_pass in passes.values():  # in the order compress_mlpackage runs them
        if not weight_pass.selection.is_empty():
            model = weight_pass.run(model)
    after = weight_uses(load_program(model))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    model.save(str(dst))
    return weight_report(before, after)
