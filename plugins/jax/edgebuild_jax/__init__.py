"""edgebuild's StableHLO frontend: JAX exports, StableHLO modules and JAX functions with weights."""

__version__ = "0.1.0"
