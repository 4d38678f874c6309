"""A variant's headline in words, the same on the console's result line and on its report page:
``validation passed``, ``validation failed``, or ``built, not validated`` when validation was off,
compared nothing (``validate.reference: none``: no reference, no runtime record) or every runtime it
names was skipped (Core ML on Linux, say). No heavy imports: the console's
line for an up-to-date build is made from it."""

from __future__ import annotations

from typing import Mapping

PASSED, FAILED, NOT_VALIDATED = "validation passed", "validation failed", "built, not validated"


def verdict(*, failed: bool, validated: bool) -> str:
    return FAILED if failed else PASSED if validated else NOT_VALIDATED


def compared(runtimes: Mapping) -> bool:
    """Whether any runtime (a record or its JSON) compared the artifact with the reference."""
    for record in runtimes.values():
        skipped = record.get("skipped") if isinstance(record, Mapping) else getattr(record, "skipped", None)
        if not skipped:
            return True
    return False
