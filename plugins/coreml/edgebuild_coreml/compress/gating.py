"""Which deployment target each compression mode needs, checked once, when the recipe loads.

The rules read a validated section (``config.CompressionSection``) by its fields and each
weights config by its ``mode``, so this module sits below the models that call it.
"""

from __future__ import annotations

import re

from edgebuild.plugin import RecipeError

# Core ML opset generations, named by their iOS release; other OSes map onto them.
_GENERATION = {"iOS": 0, "macOS": -3, "tvOS": 0, "watchOS": 7, "visionOS": 16}
_IOS_BY_MACOS = {13: 16, 14: 17, 15: 18, 26: 26}


def ios_level(target: str) -> int:
    """The iOS release whose Core ML features ``target`` (e.g. "iOS17", "macOS14") has."""
    found = re.fullmatch(r"(iOS|macOS|tvOS|watchOS|visionOS)(\d+)", target.strip())
    if not found:
        raise RecipeError(
            f"unknown deployment target {target!r}",
            hint="use a name like iOS17 or macOS14",
        )
    family, version = found.group(1), int(found.group(2))
    if family == "macOS":
        return _IOS_BY_MACOS.get(version, version + 3)
    return version + _GENERATION[family]


def required_features(section) -> list[tuple[str, int]]:
    """Every feature the section's weights, overrides and activations use, with the iOS release
    that introduced it (``auto`` candidates: see ``check_deployment_target``)."""
    needs: list[tuple[str, int]] = []
    weight_configs = [section.weights] + [override.weights for override in section.overrides]
    for weights in weight_configs:
        if weights is not None:
            needs.extend(weight_features(weights))
    if section.activations is not None:
        needs.append(("activation quantisation (W8A8)", 17))
    return needs


def check_deployment_target(section, target: str) -> None:
    """Raise RecipeError naming the first feature ``target`` is too old for, ``auto`` candidates included."""
    level = ios_level(target)
    for feature, needed in required_features(section):
        if level < needed:
            raise RecipeError(
                f"{feature} needs iOS{needed}; the recipe targets {target}",
                hint=f"raise target.deployment_target to iOS{needed} or change compression",
            )
    if section.auto is not None:
        _check_auto_candidates(section.auto, target, level)


def _check_auto_candidates(auto, target: str, level: int) -> None:
    for index, candidate in enumerate(auto.candidates):
        for feature, needed in weight_features(candidate):
            if level < needed:
                raise RecipeError(
                    f"compression.auto.candidates[{index}]: {feature} needs iOS{needed}; the recipe targets {target}",
                    hint=f"raise target.deployment_target to iOS{needed} or drop that candidate",
                )


def weight_features(weights) -> list[tuple[str, int]]:
    """The features one weights config (palettize, linear, prune or an auto candidate's none) uses."""
    if weights.mode == "none":
        return []
    if weights.mode == "prune":
        needs = [(f"{weights.method} pruning", 16)]
        if weights.then is not None:
            needs.append((f"joint compression (prune then {weights.then.mode})", 18))
            needs.extend(weight_features(weights.then))
        return needs
    if weights.mode == "palettize":
        bits = f"{weights.nbits}-bit " if weights.nbits else ""
        needs = [(f"{bits}palettisation", 16)]
        if weights.nbits == 3:  # iOS16's table sizes are 2, 4, 16, 64 and 256 entries
            needs.append(("3-bit palettisation", 18))
        if weights.granularity == "per_grouped_channel":
            needs.append((f"{bits}per-grouped-channel palettisation", 18))
        if weights.cluster_dim > 1:
            needs.append((f"{bits}vector palettisation (cluster_dim {weights.cluster_dim})", 18))
        if weights.per_channel_scale:
            needs.append(("palettisation with per-channel scales", 18))
        return needs
    assert weights.mode == "linear", weights.mode
    bits = weights.dtype.removeprefix("u").removeprefix("int")
    needs = [(f"{bits}-bit linear quantisation", 16)]
    if weights.granularity == "per_block":
        needs.append((f"{bits}-bit per-block linear quantisation", 18))
    if bits == "4":
        needs.append((f"4-bit {weights.granularity.replace('_', '-')} linear quantisation", 18))
    return needs
