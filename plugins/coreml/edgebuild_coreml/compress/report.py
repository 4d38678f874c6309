"""The compress stage's report: every weight's sizes before and after, and how it was compressed."""

from __future__ import annotations


def weight_report(before: dict, after: dict) -> dict:
    """Per weight: name, op type, shape, bytes before and after, and how it was compressed.

    ``before``/``after``: weight uses (``program.weight_uses``) around the compression.
    """
    weights = []
    for name, original in before.items():
        compressed = after.get(name, original)
        weights.append(
            {
                "name": name,
                "op_type": original.op_type,
                "shape": list(original.shape),
                "bytes_before": original.bytes,
                "bytes_after": compressed.bytes,
                "mode": compressed.mode,
            }
        )
    return {
        "weights": weights,
        "bytes_before": sum(w["bytes_before"] for w in weights),
        "bytes_after": sum(w["bytes_after"] for w in weights),
    }


_GRANULARITY = {"per_tensor": "per-tensor", "per_channel": "per-channel", "per_block": "per-block",
                "per_grouped_channel": "per-grouped-channel"}


def weights_in_words(config) -> str:
    """One weight config as a reader says it: ``int8 linear weights, per-channel``,
    ``4-bit palettized weights, per-grouped-channel (groups of 16)``, ``no compression``."""
    if config is None or config.mode == "none":
        return "no compression"
    if config.mode == "linear":
        words = [f"{config.dtype} linear weights", _granularity(config.granularity, config.block_size, "blocks")]
        if not config.symmetric:
            words.append("asymmetric")
        return ", ".join(words)
    if config.mode == "palettize":
        bits = f"{config.nbits}-bit" if config.nbits else "unique-value"
        words = [f"{bits} palettized weights", _granularity(config.granularity, config.group_size, "groups")]
        if config.algorithm != "kmeans":
            words.append(config.algorithm.replace("_", " "))
        if config.cluster_dim > 1:
            words.append(f"{config.cluster_dim}-d clusters")
        if config.per_channel_scale:
            words.append("per-channel scale")
        return ", ".join(words)
    # prune
    if config.method == "n_m" and config.n_m:
        how = f"{config.n_m[0]}:{config.n_m[1]} sparsity"
    elif config.target_sparsity is not None:
        how = f"{config.target_sparsity:.0%} of the smallest zeroed"
    else:
        how = f"values below {config.threshold:g} zeroed"
    pruned = f"pruned weights ({how})"
    return pruned if config.then is None else f"{pruned}, then {weights_in_words(config.then)}"


def _granularity(granularity: str, size: int, unit: str) -> str:
    words = _GRANULARITY.get(granularity, granularity)
    return f"{words} ({unit} of {size})" if granularity in ("per_block", "per_grouped_channel") else words


def section_in_words(section) -> str:
    """What a compression section applies, in words: its weights, each override, activations
    (``int8 linear weights, per-channel; conv ops named stem.*: no compression``)."""
    parts = [weights_in_words(section.weights) if section.weights is not None or not section.overrides
             else "weights as they are"]
    for override in section.overrides:
        match = override.match
        if match.role is not None:
            which = f"the {match.role.replace('_', ' ')}"
        else:
            which = f"{match.op_type or ''} ops".lstrip() + (f" named {match.name}" if match.name else "")
        parts.append(f"{which}: {weights_in_words(override.weights)}")
    if section.activations is not None:
        parts.append(f"{section.activations.dtype} activations")
    return "; ".join(parts)
