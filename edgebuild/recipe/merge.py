"""Deep merge of recipe dicts, for ``extends:`` and ``variants:``."""

from __future__ import annotations


def deep_merge(base, override):
    """``override`` onto ``base``: mappings merge key by key, anything else replaces.

    An explicit ``null`` replaces too, so ``compression: null`` in a variant turns it off. A
    mapping that picks a different ``mode`` (a palettize config overridden by a linear one)
    is a different choice, not a refinement: it replaces rather than inheriting keys that
    mean nothing to its mode.
    """
    if isinstance(base, dict) and isinstance(override, dict):
        if "mode" in base and "mode" in override and base["mode"] != override["mode"]:
            return override
        merged = dict(base)
        for key, value in override.items():
            merged[key] = deep_merge(base[key], value) if key in base else value
        return merged
    return override


def merge_locations(base: dict, override: dict) -> dict:
    """Locations of a merge: the override's where it has a path, the base's elsewhere."""
    overridden = {path for path in override if path}
    # a base path goes when it is overridden or lies under an overridden path: one set look-up
    # per prefix, so merging costs the size of the two maps, not their product
    merged = {path: loc for path, loc in base.items()
              if not any(path[:end] in overridden for end in range(1, len(path) + 1))}
    merged.update(override)
    return merged
