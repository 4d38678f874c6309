"""edgebuild-mpsgraph: ONNX segments lowered to MPSGraph program descriptions
(``program.json`` + ``weights.bin``), a numpy reference executor of that op vocabulary,
and the ``bundle`` backend that splits a model across Core ML, MPSGraph and Metal kernels."""

__version__ = "0.1.0"

from edgebuild_mpsgraph.executor import run_program
from edgebuild_mpsgraph.program import Program, load_program, save_program

__all__ = ["Program", "load_program", "run_program", "save_program"]
