"""Errors raised while lowering one node; the converter collects them per node."""

from __future__ import annotations

from edgebuild.plugin import BuildError


class LoweringError(BuildError):
    """A node the lowering cannot express in MIL (names the node and says why)."""


class TargetTooOld(LoweringError):
    """The node needs a newer deployment target than the recipe's."""
