"""edgebuild's StableHLO frontend: JAX exports, StableHLO modules and JAX functions with weights."""

import os

# jaxlib's CPU client logs its device count at INFO on start; a build's output is not the place
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"
