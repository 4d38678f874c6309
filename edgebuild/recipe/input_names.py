"""A model input with an empty name cannot be named in a recipe or fed by name (in ONNX, a node
input named "" means "no input", so nothing can read it either): the model is refused where it is
first read — recipe checks, the ONNX frontend, ``edgebuild init`` — with its file, the input's
position and how to fix it. Kept light: recipe checks import it on every run."""

from __future__ import annotations

from pathlib import Path


def first_unnamed(names) -> int | None:
    """The position of the first empty name in ``names``, or None."""
    return next((index for index, name in enumerate(names) if not name), None)


def unnamed_input_message(path: Path | str, index: int, count: int) -> tuple[str, str]:
    """(message, hint) for input ``index`` of ``count`` in the model at ``path``."""
    message = (f"{path}: graph.input[{index}] (input {index + 1} of {count}) has an empty name; a recipe names "
               "each input, and runtimes feed inputs by name")
    hint = ("give it a name: re-export with names (torch.onnx.export(..., input_names=[...])), or rename it with "
            f"onnx: m = onnx.load(F); m.graph.input[{index}].name = 'x'; point the node inputs that should read "
            "it at 'x'; onnx.save(m, F)")
    return message, hint
