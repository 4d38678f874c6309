"""Route (b): coremltools' own torch frontend, for programs the ONNX exporter cannot take.

The result is an fp32 ``.mlpackage`` (the recipe's precision is applied downstream, by the
backend, as for every other route) plus ``route.json`` telling later stages to pass it
through instead of lowering ONNX. The decomposed program is kept as ``model.pt2`` so a
backend that wants to convert again (other precision, deployment target) can.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

from edgebuild.plugin import BuildError

MLPACKAGE = "model.mlpackage"
PROGRAM = "model.pt2"
DEPLOYMENT_TARGET = "iOS17"


def require_coremltools():
    try:
        import coremltools as ct
    except ImportError:
        raise BuildError(
            "source.options.route coreml needs coremltools: pip install 'edgebuild-pytorch[coreml]'"
        ) from None
    return ct


def convert_with_coremltools(program, out_dir: Path, *, input_names: list[str], output_names: list[str],
                             deployment_target: str = DEPLOYMENT_TARGET) -> dict:
    import torch

    require_coremltools()
    decomposed = program.run_decompositions(_decompositions())  # coremltools takes the ATen dialect
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.export.save(decomposed, str(out_dir / PROGRAM))
    if coremltools_without_torch():
        # this process's coremltools was imported lean (edgebuild_coreml.coremltools_import), before
        # torch, and keeps no torch frontend: convert the saved program where torch comes first
        counts = _convert_in_fresh_interpreter(str(out_dir / PROGRAM), str(out_dir), input_names, output_names,
                                               deployment_target)
    else:
        counts = _convert(decomposed, out_dir, input_names, output_names, deployment_target)
    return {"deployment_target": deployment_target, "mil_ops": counts}


def coremltools_without_torch() -> bool:
    """True when coremltools was imported before torch with its torch frontend left out."""
    from coremltools import _deps

    return not _deps._HAS_TORCH


def _convert_in_fresh_interpreter(*arguments) -> dict[str, int]:
    """``_convert_saved_program`` in a new interpreter started on this module, not through
    multiprocessing's spawn, whose child imports the caller's ``__main__`` again: a script that
    calls ``edgebuild.build()`` without a main guard would build once more in it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-m", __name__, json.dumps(arguments)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise BuildError(f"coremltools' torch conversion failed in its own process: {last}")
    return json.loads(done.stdout)


def _convert_saved_program(program_path: str, out_dir: str, input_names: list[str], output_names: list[str],
                           deployment_target: str) -> dict[str, int]:
    """In a fresh process: torch first, so coremltools is imported with its torch frontend."""
    import torch

    require_coremltools()
    if coremltools_without_torch():
        raise BuildError("coremltools was imported without its torch frontend, although torch was imported first")
    program = torch.export.load(program_path)
    return _convert(program, Path(out_dir), input_names, output_names, deployment_target)


def _convert(decomposed, out_dir: Path, input_names: list[str], output_names: list[str],
             deployment_target: str) -> dict[str, int]:
    """``ct.convert`` on the decomposed program, inputs and outputs renamed, saved as ``model.mlpackage``."""
    ct = require_coremltools()
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlmodel = ct.convert(
            decomposed,
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT32,
            minimum_deployment_target=getattr(ct.target, deployment_target),
        )
    spec = mlmodel.get_spec()
    current_inputs = [i.name for i in spec.description.input]
    current_outputs = [o.name for o in spec.description.output]
    if len(current_inputs) != len(input_names) or len(current_outputs) != len(output_names):
        raise BuildError(
            f"coremltools produced {len(current_inputs)} input(s) and {len(current_outputs)} output(s), "
            f"expected {len(input_names)} and {len(output_names)}"
        )
    for old, new in zip(current_inputs + current_outputs, input_names + output_names):
        if old != new:
            ct.utils.rename_feature(spec, old, new)
    renamed = ct.models.MLModel(spec, weights_dir=mlmodel.weights_dir, skip_model_load=True)
    renamed.save(str(out_dir / MLPACKAGE))
    return _op_counts(mlmodel)


def _decompositions() -> dict:
    """Only what coremltools lacks a converter for (the LSTM cell's ``unsafe_split``); the rest
    stays as the larger ops coremltools maps one to one."""
    import torch
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([aten.unsafe_split, aten.unsafe_split_with_sizes, aten.unsafe_chunk])


def _op_counts(mlmodel) -> dict[str, int]:
    counts: dict[str, int] = {}
    program = getattr(mlmodel, "_mil_program", None)
    if program is None:
        return counts
    for function in program.functions.values():
        for op in function.operations:
            counts[op.op_type] = counts.get(op.op_type, 0) + 1
    return dict(sorted(counts.items()))


if __name__ == "__main__":  # the fresh interpreter of _convert_in_fresh_interpreter
    try:
        print(json.dumps(_convert_saved_program(*json.loads(sys.argv[1]))))
    except BuildError as exc:
        sys.exit(f"error: {exc}")
