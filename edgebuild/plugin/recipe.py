"""The recipe models and shape helpers a backend reads when it declares its stages."""

from edgebuild.recipe import Recipe, Variant
from edgebuild.recipe.checks import closest
from edgebuild.recipe.generate import DERIVED_INPUTS, GenerateSection, cache_pairs, describe
from edgebuild.recipe.model import (COMPUTE_POLICIES, Compute, ComputeOverride, ComputePolicy, ComputeUnit, OpMatch,
                                   Quantization)
from edgebuild.recipe.passes import pass_switches
from edgebuild.recipe.shapes import has_range, per_dim, whole_shapes

__all__ = ["Recipe", "Variant", "closest", "GenerateSection", "DERIVED_INPUTS", "cache_pairs", "describe", "OpMatch",
           "has_range", "per_dim", "whole_shapes", "COMPUTE_POLICIES", "Compute", "ComputeOverride", "ComputePolicy",
           "ComputeUnit", "Quantization", "pass_switches"]
