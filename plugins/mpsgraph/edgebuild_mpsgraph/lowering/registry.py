"""The MPSGraph lowerings this plugin provides, collected by decorator and registered
with edgebuild's registry (backend ``mpsgraph``) by ``plugin.py``."""

from __future__ import annotations

from edgebuild.plugin import LoweringSet

LOWERINGS = LoweringSet("mpsgraph")
lowers = LOWERINGS.lowers
