"""``source.options`` of a StableHLO source; filled in by the frontend."""

from __future__ import annotations

from edgebuild.plugin import RecipeSection


class StableHLOOptions(RecipeSection):
    pass
