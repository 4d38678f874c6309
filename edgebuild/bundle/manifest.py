"""The bundle format: ``bundle/manifest.json`` and the segments it lists.

A bundle runs one model across several runtimes. ``manifest.json`` lists the segments in
execution order — each one's backend, files (relative to the bundle), inputs and outputs
with dtype, shape and layout, and compute units — and the hand-offs: which segment output
(or graph input) feeds which segment input (or graph output). A runtime executes segments
in order, passing each tensor by name. ``schemas/bundle.schema.json`` is generated from
:class:`Manifest` (``python -m edgebuild.bundle.manifest --out schemas/bundle.schema.json``).

Layout: ``segments/<index>_<backend>/`` holds ``model.mlpackage`` (coreml),
``program.json`` + ``weights.bin`` (mpsgraph) or ``kernel.metal`` + ``kernel.json`` (msl).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from edgebuild.errors import BuildError

FORMAT = "edgebuild-bundle"
VERSION = 1
MANIFEST = "manifest.json"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "bundle.schema.json"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorSpec(Strict):
    """A tensor at a border: ``name`` is the model's value name, ``binding`` the segment's own name for it."""

    name: str
    dtype: Literal["float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]
    shape: list[int] = Field(description="static dims")
    layout: Literal["row_major"] = Field(default="row_major", description="dense, C order (NCHW for images)")
    binding: Optional[str] = Field(default=None, description="the name inside the segment's artifact, when it differs")


class SegmentSpec(Strict):
    index: int = Field(ge=0)
    backend: str = Field(description="coreml | mpsgraph | msl (or a plugin's backend)")
    path: str = Field(description="the segment's directory, relative to the bundle")
    files: dict[str, str] = Field(description="role -> file relative to the bundle (model, program, weights, source, spec)")
    compute_units: str = Field(description="where it runs: Core ML's CPU_ONLY/CPU_AND_GPU/CPU_AND_NE/ALL, or GPU")
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: dict[str, int] = Field(default={}, description="source op types in the segment, with counts")


class HandOffSpec(Strict):
    """``tensor`` flows from ``from_segment`` (null: a graph input) to ``to_segment`` (null: a graph output)."""

    tensor: str
    from_segment: Optional[int] = None
    to_segment: Optional[int] = None


class Manifest(Strict):
    format: Literal["edgebuild-bundle"] = FORMAT
    version: Literal[1] = VERSION
    name: str = Field(description="recipe name")
    variant: Optional[str] = None
    compute_policy: str = "auto"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    segments: list[SegmentSpec]
    handoffs: list[HandOffSpec]
    versions: dict[str, str] = Field(default={}, description="edgebuild and plugin versions that built it")

    def segment_dir(self, root: Path, segment: SegmentSpec) -> Path:
        return Path(root) / segment.path


def schema_text() -> str:
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgebuild bundle manifest"
    return json.dumps(schema, indent=2) + "\n"


def write_manifest(manifest: Manifest, bundle_dir: Path) -> Path:
    path = Path(bundle_dir) / MANIFEST
    path.write_text(manifest.model_dump_json(indent=1) + "\n")
    return path


def read_manifest(bundle_dir: Path) -> Manifest:
    path = Path(bundle_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"{path}: cannot read the bundle manifest: {exc}") from exc
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise BuildError(f"{path}: not an {FORMAT} manifest of version {VERSION} "
                         f"(found {data.get('format')!r} version {data.get('version')!r})",
                         hint="rebuild the bundle with this version of edgebuild")
    return Manifest.model_validate(data)


if __name__ == "__main__":  # python -m edgebuild.bundle.manifest [--out FILE]
    text = schema_text()
    if "--out" in sys.argv:
        Path(sys.argv[sys.argv.index("--out") + 1]).write_text(text)
    else:
        sys.stdout.write(text)
