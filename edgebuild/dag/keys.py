"""Cache keys: sha256 over canonical JSON of what determines a stage's output."""

from __future__ import annotations

import hashlib
import json

from edgebuild.versions import edgebuild_version


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def stage_key(kind: str, params: dict, inputs: dict[str, str], plugins: dict[str, str],
              libraries: dict[str, str] | None = None) -> str:
    """Key of a stage: its kind, its typed parameters' dump, input digests, the versions of the plugins
    whose registrations it may call and of the libraries that produce or judge its output."""
    payload = {
        "stage": kind,
        "params": params,
        "inputs": inputs,
        "plugins": plugins,
        "libraries": libraries or {},
        "edgebuild": edgebuild_version(),
    }
    return hashlib.sha256(canonical(payload).encode()).hexdigest()


def key_of(stage, digests: dict[str, str]) -> str:
    """The key of ``stage`` (an :class:`edgebuild.stage.Stage`) given its inputs' digests by stage name."""
    return stage_key(stage.name, stage.key_params(), {d: digests[d] for d in stage.deps}, stage.plugins,
                     stage.libraries_versions)
