"""Cache keys: sha256 over canonical JSON of what determines a stage's output."""

from __future__ import annotations

import hashlib
import json

from edgebuild.versions import edgebuild_version


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def stage_key(kind: str, params: dict, inputs: dict[str, str], plugins: dict[str, str]) -> str:
    """Key of a stage: its kind, parameters after defaults, input digests, producing plugins' versions."""
    payload = {
        "stage": kind,
        "params": params,
        "inputs": inputs,
        "plugins": plugins,
        "edgebuild": edgebuild_version(),
    }
    return hashlib.sha256(canonical(payload).encode()).hexdigest()
