"""``edgebuild verify ARTIFACT --reference MODEL``: the comparison, callable from scripts too.

The CLI command (``edgebuild.cli.app.verify``) parses options and prints; :func:`verify_artifact`
checks the arguments, chooses the reference (``edgebuild.verify.against``) and runs the same
comparison a build's validate stage runs, returning its judged record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping


def runtime_for(artifact: Path, registry):
    """The runtime that reads ``artifact``: a reference executor before a native one."""
    from edgebuild.errors import UsageError

    if not artifact.exists():
        raise UsageError(f"{artifact}: no such artifact", file=str(artifact))
    runtimes = [registry.get("runtimes", name) for name in registry.names("runtimes")]
    for runtime in sorted(runtimes, key=lambda r: r.native):  # a reference executor reads an artifact best
        if runtime.can_run(artifact):
            return runtime
    raise UsageError(f"{artifact}: no installed runtime can read this artifact",
                     hint="check `edgebuild plugins` for a backend that produces it", file=str(artifact))


def inputs_section(path: Path, samples: int, thresholds: dict):
    """The ``ValidateSection`` of ``verify --inputs FILE``: FILE is a YAML mapping from input name
    to source, as under a recipe's ``validate.inputs`` (``tokens``, ``random``, ``value``, ``file``,
    ``images``); paths in it are resolved against FILE's folder. Errors name FILE's line."""
    from pydantic import ValidationError

    from edgebuild.errors import UsageError
    from edgebuild.recipe.errors import format_errors
    from edgebuild.recipe.locations import load_yaml
    from edgebuild.recipe.validation import ValidateSection

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--inputs {path}: no such file" if not path.exists() else f"--inputs {path}: is a directory",
                         hint="give a YAML file mapping each input name to its source, as under validate.inputs")
    data, locations = load_yaml(path, str(path))
    if not isinstance(data, dict):
        raise UsageError(f"{path}:1:1 --inputs: a mapping from input name to source (tokens, random, value, file, "
                         "images) is expected", hint="e.g. `input_ids: {tokens: {vocab: 1000}}`")
    section = {"samples": samples, "thresholds": thresholds, "inputs": data}
    try:
        return ValidateSection.model_validate(section)
    except ValidationError as exc:
        located = {("inputs", *where): loc for where, loc in locations.items()}
        raise format_errors(exc, section, located, ValidateSection) from None


def verify_artifact(artifact: Path, reference: Path, section, *, registry=None, runtime=None,
                    shapes: Mapping[str, list[int]] | None = None, base_dir: Path | None = None) -> dict:
    """The judged ``validation`` record of ``artifact`` against ``reference`` on ``section``'s
    samples and limits (a ``ValidateSection``); ``shapes`` pins inputs (``--shape``). Raises
    UsageError for arguments that do not fit together."""
    from edgebuild.bundle.session import named_runner
    from edgebuild.cli.arguments import check_reference, check_reference_file
    from edgebuild.dag.validate import validate
    from edgebuild.verify.against import artifact_inputs, choose_verify_reference, fed_at_its_rank, reference_format
    from edgebuild.verify.reference import ONNX_FORMAT

    if registry is None:
        from edgebuild.registry import get_registry

        registry = get_registry()
    artifact, reference = Path(artifact), Path(reference)
    runtime = runtime or runtime_for(artifact, registry)
    check_reference_file(reference)
    if reference_format(reference) == ONNX_FORMAT:
        check_reference(reference, artifact, runtime)
    chosen = choose_verify_reference(reference, artifact, runtime, registry, shapes)
    candidate = fed_at_its_rank(named_runner(runtime, artifact), artifact_inputs(runtime, artifact)[1])
    return validate(section, reference, {}, candidate, base_dir or Path.cwd(),
                    candidate_name=runtime.name, reference=chosen.runner, specs=chosen.specs,
                    reference_name=chosen.name)
