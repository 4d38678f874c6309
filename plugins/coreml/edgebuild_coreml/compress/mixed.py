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
import coremltools.optimize.coreml as cto

from .apply import WeightPass, _report, plan_weight_passes
from .config import CompressionSection
from .program import load_program, weight_uses


def compress_per_const(src: Path, dst: Path, modes: Mapping[str, object], *, weight_threshold: int) -> dict:
    """Write ``dst`` with each const named in ``modes`` compressed by its weights config.

    ``modes`` maps const op names to PalettizeWeights / LinearWeights; every other weight stays
    as stored. Returns the same report as ``compress_mlpackage``.
    """
    model = ct.models.MLModel(str(src), skip_model_load=True)
    program = load_program(model)
    before = weight_uses(program)
    merged: dict[str, WeightPass] = {}
    for const_name, weights in modes.items():
        section = CompressionSection(weights=weights, weight_threshold=weight_threshold)
        for single in plan_weight_passes(section, program):
            into = merged.setdefault(single.kind, WeightPass(single.kind, cto.OptimizationConfig(), single.joint))
            into.config.op_name_configs[const_name] = single.config.global_config
            into.lut_functions.extend(single.lut_functions)
    for kind in ("prune", "linear", "palettize"):  # the order compress_mlpackage runs them in
        if kind in merged:
            model = merged[kind].run(model)
    after = weight_uses(load_program(model))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    model.save(str(dst))
    return _report(before, after)
