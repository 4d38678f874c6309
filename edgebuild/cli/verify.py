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
