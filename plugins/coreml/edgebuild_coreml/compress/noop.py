"""A compression that changes nothing says so: an error when no weight it targets changed, a
warning naming the ones it left alone otherwise.

coremltools' passes skip a weight they cannot compress with a log line at most (``unique``
palettisation of a weight with more than 256 distinct values, a group size that does not divide
the channels, a pruning threshold below every value), so a recipe could ask for compression and
ship the model unchanged. A weight is targeted when the section gives it a mode (override by
name, then by op type, then the global one, as coremltools resolves them) and it has at least
``weight_threshold`` elements.
"""

from __future__ import annotations

import re

from edgebuild.plugin import BuildError

from .config import CompressionSection, PalettizeWeights, PruneWeights

SHOWN = 8  # weights named in a message; the rest are counted


def _mode_for(section: CompressionSection, op_name: str, op_type: str):
    """The weights config coremltools applies to the weights of op ``op_name`` (None: left alone)."""
    by_name = [o for o in section.overrides if o.match.name is not None and re.fullmatch(o.match.name, op_name)
               and o.match.op_type in (None, op_type)]
    if by_name:
        return by_name[-1].weights
    by_type = [o for o in section.overrides if o.match.name is None and o.match.op_type == op_type]
    if by_type:
        return by_type[-1].weights
    return section.weights


def _elements(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _hint(weights) -> str:
    if isinstance(weights, PalettizeWeights) and weights.algorithm == "unique":
        return ("algorithm 'unique' only palettizes weights with at most 256 distinct values; trained weights "
                "have far more: use algorithm kmeans with nbits")
    if isinstance(weights, PruneWeights) and weights.method == "threshold":
        return f"no weight has values below threshold {weights.threshold}: raise it, or use method magnitude"
    if isinstance(weights, PalettizeWeights) and weights.granularity == "per_grouped_channel":
        return f"group_size {weights.group_size} must divide the weights' channel counts"
    return "check the mode's parameters against these weights' shapes, or remove the compression"


def _names(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _targeted(section: CompressionSection, before: dict) -> dict:
    """Weight name -> the config the section gives it, for weights large enough to be compressed."""
    targeted = {}
    for name, use in before.items():
        config = _mode_for(section, name.rsplit(".", 1)[0], use.op_type)
        if config is not None and _elements(use.shape) >= section.weight_threshold:
            targeted[name] = config
    return targeted


def check_something_changed(section: CompressionSection, before: dict, after: dict) -> list[str]:
    """``before``/``after``: weight uses (``program.weight_uses``) around the compression.

    Raise BuildError if no targeted weight changed; else warnings naming the ones left alone.
    """
    if section.auto is not None:
        return []  # auto keeps layers uncompressed on purpose
    targeted = _targeted(section, before)
    left = [name for name in targeted
            if name in after and (after[name].mode, after[name].bytes) == (before[name].mode, before[name].bytes)]
    if not left:
        return []
    hint = _hint(targeted[left[0]])
    if len(left) == len(targeted):
        raise BuildError(f"compression changed no weight: the {len(left)} weight(s) it applies to were left as "
                         f"they were ({_names(left)})", hint=hint)
    return [f"compression left {len(left)} of {len(targeted)} weight(s) as they were: {_names(left)} ({hint})"]
