"""``edgebuild verify``: a built artifact against a reference model, with no recipe.

The reference is read by the frontend its file's suffix names (``edgebuild.recipe.formats``): an
ONNX model runs in onnxruntime; any other format is evaluated by its frontend's own reference
runner (``Frontend.reference``: JAX for a StableHLO export, the eager module for PyTorch), so the
core never learns what that runner is. Both sides are fed at the shapes the artifact takes; a
symbolic dim the artifact does not size is pinned with ``--shape NAME=D,D,...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

from edgebuild.errors import RecipeError, UsageError
from edgebuild.recipe.formats import SUFFIXES
from edgebuild.verify.reference import ONNX_FORMAT, Reference

SHAPE_HINT = "e.g. --shape x=1,3,224,224 (once per input)"


def parse_shapes(given: Sequence[str]) -> dict[str, list[int]]:
    """``--shape NAME=D,D,...`` options as ``{name: [sizes]}``; a malformed one is a UsageError."""
    shapes: dict[str, list[int]] = {}
    for text in given:
        name, sep, dims = text.partition("=")
        name = name.strip()
        try:
            sizes = [int(d) for d in dims.split(",")] if dims.strip() else []
        except ValueError:
            sizes = None
        if not sep or not name or sizes is None or any(d < 1 for d in sizes):
            raise UsageError(f"--shape {text!r}: expected NAME=D,D,... with positive sizes", hint=SHAPE_HINT)
        if name in shapes:
            raise UsageError(f"--shape {name}: given twice", hint="give each input's shape once")
        shapes[name] = sizes
    return shapes


def reference_format(path: Path) -> str:
    """The frontend that reads ``path``, by its suffix (ONNX when none says otherwise)."""
    name = path.name.lower()
    return next((fmt for suffix, fmt in SUFFIXES.items() if name.endswith(suffix)), ONNX_FORMAT)


def artifact_inputs(runtime, artifact: Path) -> tuple[Optional[list[str]], dict[str, list[int]]]:
    """The inputs ``artifact`` takes and the shape of each it describes, by the source model's names."""
    try:
        taken = runtime.input_names(artifact)
        shapes = runtime.input_shapes(artifact) or {}
        renamed = (runtime.tensor_names(artifact) or {}).get("inputs") or {}
    except Exception as exc:  # noqa: BLE001 - an unreadable artifact is the user's to fix
        raise UsageError(f"{artifact}: cannot read the artifact ({type(exc).__name__}: {exc})") from None
    source_of = {artifact_name: source for source, artifact_name in renamed.items()}
    names = None if taken is None else [source_of.get(name, name) for name in taken]
    sized = {source_of.get(name, name): [int(d) for d in dims] for name, dims in shapes.items()
             if all(int(d) > 0 for d in dims)}
    return names, sized


def fed_at_its_rank(candidate, artifact_shapes: Mapping[str, list[int]]):
    """``candidate`` fed each input at the rank the artifact declares for it: Core ML has no rank-0
    inputs, so a backend takes a scalar as shape [1]; an input of the artifact's size and another rank is
    reshaped to it (a size that differs is left for the artifact to refuse)."""
    import numpy as np

    def run(inputs):
        fitted = {}
        for name, value in inputs.items():
            value, shape = np.asarray(value), artifact_shapes.get(name)
            if shape is not None and len(shape) != value.ndim and int(np.prod(shape)) == value.size:
                value = value.reshape(shape)
            fitted[name] = value
        return candidate(fitted)

    return run


def frontend_reference(reference: Path, fmt: str, registry, artifact: Path, runtime,
                       shapes: Mapping[str, list[int]]) -> Reference:
    """The reference a non-ONNX ``reference`` model's frontend evaluates, with the input specs it
    reports, checked against the inputs ``artifact`` takes. ``shapes``: the ``--shape`` pins."""
    frontend = registry.get("frontends", fmt)
    if frontend is None:
        raise UsageError(f"--reference {reference}: a {fmt} model, and no installed plugin reads {fmt}",
                         hint="install the plugin for that format; `edgebuild plugins` lists the frontends")
    taken, sized = artifact_inputs(runtime, artifact)
    pins = {name: {"shape": list(dims)} for name, dims in {**sized, **shapes}.items()}
    try:
        runner = frontend.reference(reference, pins, None, reference.parent)
    except RecipeError as exc:
        # the frontend refuses the inputs as a recipe would give them (source.inputs.NAME...): here
        # they come from the artifact and --shape, so say which input needs a --shape
        path = tuple(exc.path or ())
        if path[:2] != ("source", "inputs") or len(path) < 3:
            raise
        raise UsageError(f"--reference {reference}: {exc.message}",
                         hint=f"the artifact does not say the size it takes; give it: --shape {path[2]}=D,D,...") \
            from None
    if runner is None:
        raise UsageError(f"--reference {reference}: the {fmt} frontend has no reference of its own to run",
                         hint="verify against the .onnx model the artifact was built from")
    # a runner that read its inputs from the source itself carries them (see choose_reference)
    specs = {name: dict(spec) for name, spec in (getattr(runner, "input_specs", None)
                                                 or frontend.input_specs(pins)).items()}
    check_inputs(reference, artifact, specs, taken)
    check_shapes(shapes, specs)
    for name, dims in shapes.items():
        if list(specs[name]["shape"]) != list(dims):
            raise UsageError(f"--shape {name}={','.join(map(str, dims))}: the reference takes {name} at "
                             f"{specs[name]['shape']}", hint="--shape sizes only the reference's symbolic dims")
    return Reference(runner, specs, f"{fmt} (eager)")


def check_inputs(reference: Path, artifact: Path, specs: Mapping[str, dict], taken: Optional[list[str]]) -> None:
    """The artifact takes exactly the reference's free inputs (``taken``: None when it cannot tell)."""
    if taken is None:
        return
    missing = [name for name in taken if name not in specs]
    if missing:
        raise UsageError(
            f"--reference {reference} does not match {artifact}: the artifact takes input(s) "
            f"{', '.join(map(repr, missing))}, which the reference model does not have "
            f"(it has {', '.join(map(repr, sorted(specs))) or 'none'})",
            hint="give the model the artifact was built from")
    unfed = [name for name, spec in specs.items() if name not in taken and "value" not in spec]
    if unfed:
        raise UsageError(
            f"--reference {reference}: it takes input(s) {', '.join(map(repr, unfed))} that {artifact} does not "
            "(fixed to a value when it was built), and verify has no value to give them",
            hint="verify with a recipe instead (`edgebuild run`), whose source.inputs give the value")


def check_shapes(shapes: Mapping[str, list[int]], specs: Mapping[str, dict]) -> None:
    """``--shape`` names inputs of the reference, at their rank."""
    for name, dims in shapes.items():
        if name not in specs:
            raise UsageError(f"--shape {name}: the reference has no input {name!r} "
                             f"(inputs: {', '.join(map(repr, sorted(specs))) or 'none'})")
        if len(dims) != len(specs[name]["shape"]):
            raise UsageError(f"--shape {name}: {len(dims)} sizes for an input of rank {len(specs[name]['shape'])}")


def onnx_reference(reference: Path, artifact: Path, runtime, shapes: Mapping[str, list[int]]) -> Reference:
    """onnxruntime on an ONNX ``reference``, at the artifact's shapes (``shapes`` first)."""
    from edgebuild.verify.reference import onnxruntime_runner
    from edgebuild.verify.shapes import at_artifact_shapes
    from edgebuild.verify.specs import onnx_input_specs

    specs = at_artifact_shapes(onnx_input_specs(reference, {}), runtime.input_shapes(artifact),
                               runtime.tensor_names(artifact).get("inputs"))
    check_shapes(shapes, specs)
    for name, dims in shapes.items():
        specs[name] = {**specs[name], "shape": list(dims)}
    return Reference(onnxruntime_runner(reference), specs, "onnxruntime")


def choose_verify_reference(reference: Path, artifact: Path, runtime, registry,
                            shapes: Mapping[str, list[int]] | None = None) -> Reference:
    """What ``verify`` holds ``artifact`` to: the reference model's evaluation and its input specs
    (an ONNX reference's inputs are checked against the artifact's by the CLI's arguments check)."""
    shapes = dict(shapes or {})
    fmt = reference_format(reference)
    if fmt == ONNX_FORMAT:
        return onnx_reference(reference, artifact, runtime, shapes)
    return frontend_reference(reference, fmt, registry, artifact, runtime, shapes)
