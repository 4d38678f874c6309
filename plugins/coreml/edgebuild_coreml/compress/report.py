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
