"""What ``optimize.level`` means for a Core ML build, past the core's graph passes.

At O3 the lower stage also runs the Neural Engine layout rewrite (``ane_layout``: linears as 1x1
convolutions in (B, C, 1, S), attention per head; outputs unchanged), when the compute policy
lets the Neural Engine run the model. ``clamp_norm_epsilon`` changes the numbers, so it stays
something a recipe asks for. A recipe whose ``compute.rewrites`` names a layout rewrite, on or
off, has chosen: the level adds nothing then. The fp16 guard and its fp32 islands are not a
level's to switch: they run at every level whenever the artifact is fp16 (``compute.fp16_guard``).

The rewrites a level adds go into the lower stage's ``compute.rewrites``, and so into its key and
its report (``rewrites``), as if the recipe had named them; below O3 nothing changes.
"""

from __future__ import annotations

from edgebuild.plugin.recipe import Compute
from edgebuild_coreml.compute import PLACEMENTS

LEVEL_REWRITES = {"O3": ("ane_layout",)}  # level -> the rewrites it turns on
LAYOUT_REWRITES = ("ane_layout", "linear_to_conv", "split_attention_heads")
NEURAL_ENGINE_UNITS = ("ALL", "CPU_AND_NE")  # compute units that include the Neural Engine


def level_rewrites(compute: Compute, level: str) -> dict[str, bool]:
    """``compute.rewrites`` with what ``level`` adds under ``compute.policy``."""
    added = LEVEL_REWRITES.get(level, ())
    if not added or PLACEMENTS[compute.policy].compute_units not in NEURAL_ENGINE_UNITS:
        return dict(compute.rewrites)
    if any(name in compute.rewrites for name in LAYOUT_REWRITES):
        return dict(compute.rewrites)
    return {**compute.rewrites, **{name: True for name in added}}


def compute_at_level(compute: Compute, level: str) -> Compute:
    """The compute section the lower stage and the plan work with at ``level``."""
    rewrites = level_rewrites(compute, level)
    return compute if rewrites == compute.rewrites else compute.model_copy(update={"rewrites": rewrites})
