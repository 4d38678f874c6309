"""edgebuild-mpsgraph: ONNX segments lowered to MPSGraph program descriptions
(``program.json`` + ``weights.bin``), a numpy reference executor of that op vocabulary,
and the ``bundle`` backend that splits a model across Core ML, MPSGraph and Metal kernels."""

__version__ = "0.1.0"

__all__ = ["Program", "load_program", "run_program", "save_program"]


def __getattr__(name: str):
    # loaded on first use: registering the plugin must not import numpy
    if name == "run_program":
        from edgebuild_mpsgraph.executor import run_program

        return run_program
    if name in ("Program", "load_program", "save_program"):
        from edgebuild_mpsgraph import program

        return getattr(program, name)
    raise AttributeError(name)
