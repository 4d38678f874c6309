"""Recipes: the YAML a user writes, validated with file:line:column errors."""

from edgebuild.recipe.loader import Variant, load_recipe
from edgebuild.recipe.model import Recipe

__all__ = ["Recipe", "Variant", "load_recipe"]
