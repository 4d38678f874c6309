"""Captures an eager module as a ``torch.export`` program of its free inputs.

Both routes start from this program. ``nn.Module``s and ExportedPrograms go through
``torch.export``. TorchScript cannot (torch.export refuses ScriptModules, and TorchScript's
own converter rejects attribute writes inside ``if`` blocks, which stateful scripts such as
silero-vad are full of), so it is first traced at the dispatcher with ``make_fx``: the script
runs once on the example inputs and every aten op it executes is recorded. Like
``torch.jit.trace``, control flow is specialised to those inputs and to the module's current
state, which is what a graph with fixed inputs means.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from edgebuild_pytorch.inputs import InputPlan, scalar_types, to_argument


def invoke(module, arguments: dict[str, Any], positional: list[str] | None = None):
    """Call with keywords, or in ``positional`` order for modules that take none."""
    if positional is None:
        return module(**arguments)
    missing = [name for name in positional if name not in arguments]
    if missing or len(arguments) != len(positional):
        from edgebuild.plugin import UsageError

        raise UsageError(
            f"source.inputs: the program takes {', '.join(positional)}; the recipe gives {', '.join(arguments)}",
            hint="name the recipe's inputs as the program's",
        )
    return module(*(arguments[name] for name in positional))


def bound_module(module, plan: InputPlan, positional: list[str] | None = None):
    """``module`` as ``forward(*free_inputs) -> tuple of tensors``, fixed inputs bound in."""
    import torch
    from torch.utils import _pytree as pytree

    scalars = scalar_types(module)
    fixed = {name: to_argument(name, value, scalars) for name, value in plan.fixed.items()}
    names = list(plan.free)

    class BoundInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *free):
            outputs = invoke(self.inner, {**dict(zip(names, free)), **fixed}, positional)
            return tuple(pytree.tree_leaves(outputs))

    bound = BoundInputs()
    bound.training = False  # not .eval(): an exported program's module refuses train()/eval() calls
    return bound


def call_module(module, arrays: dict[str, np.ndarray], positional: list[str] | None = None):
    """Run ``module`` eagerly on named numpy inputs; returns its (nested) output."""
    import torch

    scalars = scalar_types(module)
    with torch.no_grad():
        return invoke(module, {name: to_argument(name, value, scalars) for name, value in arrays.items()},
                      positional)


def output_names(outputs: Any, given: list[str] | None = None) -> list[str]:
    """One name per output tensor: the recipe's, else the key path (``last_hidden_state``) or ``output_N``."""
    from torch.utils import _pytree as pytree

    leaves_with_paths, _ = pytree.tree_flatten_with_path(outputs)
    count = len(leaves_with_paths)
    if given:
        if len(given) != count:
            from edgebuild.plugin import UsageError

            raise UsageError(
                f"source.options.output_names: {len(given)} name(s) given, the model returns {count} output(s)",
            )
        return list(given)
    if count == 1 and not leaves_with_paths[0][0]:
        return ["output"]
    names = []
    for index, (path, _) in enumerate(leaves_with_paths):
        parts = [_key_part(key) for key in path]
        name = "_".join(p for p in parts if p) or f"output_{index}"
        if name.isdigit():
            name = f"output_{name}"
        names.append(name)
    return names


def _key_part(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


@contextlib.contextmanager
def _script_interpreter_without_guards():
    """The profiling executor inserts type guards (``aten::equal`` on traced tensors) that
    ``make_fx`` cannot evaluate; the plain interpreter runs the script as written."""
    import torch

    previous = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    try:
        yield
    finally:
        torch._C._set_graph_executor_optimize(previous)


def capture(kind: str, bound, example: tuple):
    """An ExportedProgram of ``bound`` at the example inputs (static shapes)."""
    import torch

    with torch.no_grad():
        if kind == "torchscript":
            from torch.fx.experimental.proxy_tensor import make_fx

            with _script_interpreter_without_guards():
                bound = make_fx(bound)(*example)
        return torch.export.export(bound, example, strict=False)
