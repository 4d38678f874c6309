"""Runtimes for bundle segments on any OS: MPSGraph programs through the numpy executor,
Metal kernel segments through edgebuild-msl's CPU emulation of the shipped source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

import numpy as np

from edgebuild.plugin import BuildError, Runtime
from edgebuild_mpsgraph.program import PROGRAM_FILE

KERNEL_SPEC_FILE = "kernel.json"
KERNEL_SOURCE_FILE = "kernel.metal"
KERNEL_CONSTANTS_FILE = "constants.bin"


class MPSGraphReferenceRuntime(Runtime):
    name = "mpsgraph-reference"

    def can_run(self, artifact: Path) -> bool:
        return (Path(artifact) / PROGRAM_FILE).is_file()

    def run(self, artifact: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from edgebuild_mpsgraph.executor import run_program

        return run_program(Path(artifact), inputs)


def read_kernel_segment(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """``kernel.json`` and the constant inputs it keeps in ``constants.bin``, by declared name."""
    directory = Path(directory)
    record = json.loads((directory / KERNEL_SPEC_FILE).read_text())
    blob = (directory / KERNEL_CONSTANTS_FILE).read_bytes() if (directory / KERNEL_CONSTANTS_FILE).exists() else b""
    constants = {}
    for binding in record["inputs"]:
        if "constant" in binding:
            c = binding["constant"]
            raw = blob[c["offset"]:c["offset"] + c["nbytes"]]
            constants[binding["decl"]] = np.frombuffer(raw, dtype=np.dtype(c["dtype"]).newbyteorder("<")).reshape(c["shape"])
    return record, constants


class MSLEmulationRuntime(Runtime):
    """Runs a kernel segment's own ``kernel.metal`` with the declaration its op plugin registered."""

    name = "msl-emulation"

    def __init__(self, registry=None):
        self._registry = registry

    def can_run(self, artifact: Path) -> bool:
        return (Path(artifact) / KERNEL_SPEC_FILE).is_file()

    def run(self, artifact: Path, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        record, constants = read_kernel_segment(Path(artifact))
        registry = self._registry
        if registry is None:
            from edgebuild.plugin import get_registry

            registry = get_registry()
        spec = registry.get("custom_ops", (record["domain"], record["op_type"]))
        if spec is None:
            raise BuildError(f"{artifact}: no installed plugin declares {record['domain']}::{record['op_type']}",
                             hint="install the op plugin that provides its kernel")
        spec = dataclasses.replace(spec, source=Path(artifact) / KERNEL_SOURCE_FILE)
        feed = dict(constants)
        for binding in record["inputs"]:
            if "tensor" in binding:
                feed[binding["decl"]] = inputs[binding["tensor"]]
        from edgebuild_msl import compile_kernel  # the kernel SDK's public API (a declared dependency)

        produced = compile_kernel(spec).run(feed, record.get("attributes") or {})
        return {b["tensor"]: produced[b["decl"]] for b in record["outputs"]}
