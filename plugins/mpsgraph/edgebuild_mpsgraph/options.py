"""``target.options`` of the bundle backend (validated with the recipe's file:line)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import ConfigDict, Field

from edgebuild.plugin import RecipeSection

SEGMENT_BACKENDS = ("coreml", "mpsgraph")


class BundleOptions(RecipeSection):
    model_config = ConfigDict(extra="forbid")

    prefer: Optional[list[Literal[SEGMENT_BACKENDS]]] = Field(
        default=None, min_length=1,
        description="backends in order of preference; default from compute.policy "
                    "(gpu_only: [mpsgraph], otherwise [coreml, mpsgraph])")
    min_segment_ops: int = Field(default=4, ge=1, description="a segment with fewer ops is merged into a neighbour")
    min_segment_flops: float = Field(default=1e6, ge=0,
                                     description="a segment estimated cheaper than this is merged into a neighbour")


def preference(options: BundleOptions, policy: str) -> list[str]:
    if options.prefer:
        return list(options.prefer)
    return ["mpsgraph"] if policy == "gpu_only" else ["coreml", "mpsgraph"]
