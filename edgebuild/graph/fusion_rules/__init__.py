"""Fusion rules, one module per family; :mod:`edgebuild.graph.fusion` turns them into passes."""
