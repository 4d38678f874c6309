"""The recipe: pydantic models of everything a user writes in ``recipe.yaml``.

Backend-specific sections (``compression``, ``target.options``, ``source.options``) are
plain dicts here; the plugin that owns them validates them at load into its own model, kept
on the variant (see ``sections.py``), so the core stays ignorant of Core ML.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edgebuild.recipe.generate import GenerateSection
from edgebuild.recipe.validation import ValidateSection

DEPLOYMENT_TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18", "iOS26", "macOS12", "macOS13", "macOS14", "macOS15", "macOS26")
DTYPES = ("float32", "float16", "int64", "int32", "int8", "uint8", "bool")
# The one list of compute policies: backends key their meaning of each on these values
# (edgebuild.plugin.recipe exports them) and never check a policy again.
ComputePolicy = Literal["auto", "all", "cpu_only", "cpu_and_gpu", "cpu_and_ne", "ane_only", "gpu_only"]
COMPUTE_POLICIES: tuple[str, ...] = get_args(ComputePolicy)
ComputeUnit = Literal["ane", "gpu", "cpu"]  # where compute.overrides may send an op
MAX_DIM = 2**31 - 1  # Core ML and most runtimes index with int32
MAX_ELEMENTS = 2**30  # per input (4 GiB of float32): validation holds several samples of it
MAX_RANK = 8

Size = Annotated[int, Field(ge=1, le=MAX_DIM)]


class Strict(BaseModel):
    # validate_assignment: a value set after load is checked as the loaded ones were, so what
    # the stages read is always a value the recipe model allows (they never check it again)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)


class EnumeratedDim(Strict):
    """A dimension that takes one of a few sizes (Core ML EnumeratedShapes)."""

    enumerated: list[Size] = Field(min_length=1, max_length=128)


class RangeDim(Strict):
    """A dimension anywhere in ``[lo, hi]`` (Core ML RangeDim), 1 <= lo <= hi; ``default`` (in the range) is used for tracing and validation."""

    range: tuple[Size, Size]
    default: Optional[Size] = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, value):
        if value[0] > value[1]:
            raise ValueError(f"the range [{value[0]}, {value[1]}] is reversed; write [{value[1]}, {value[0]}]")
        return value

    @field_validator("default")
    @classmethod
    def _inside(cls, value, info: ValidationInfo):
        lo, hi = info.data.get("range") or (None, None)
        if value is not None and lo is not None and not lo <= value <= hi:
            raise ValueError(f"default {value} is outside the range [{lo}, {hi}]")
        return value


Dim = Union[Size, str, EnumeratedDim, RangeDim]


class EnumeratedShapes(Strict):
    """The input takes exactly one of these whole shapes (Core ML EnumeratedShapes); the first is the default."""

    enumerated: list[list[Size]] = Field(min_length=1, max_length=128)

    @field_validator("enumerated")
    @classmethod
    def _one_rank(cls, value):
        ranks = sorted({len(shape) for shape in value})
        if len(ranks) > 1:
            raise ValueError(f"the enumerated shapes have ranks {ranks}; every shape of one input has the same rank")
        if ranks and not 1 <= ranks[0] <= MAX_RANK:
            raise ValueError(f"an enumerated shape has {ranks[0]} dims; give 1 to {MAX_RANK}")
        return value

    def dims(self) -> list:
        """One entry per dim: the size where every shape agrees, else an EnumeratedDim of the sizes taken."""
        columns = [sorted(set(sizes)) for sizes in zip(*self.enumerated)]
        return [sizes[0] if len(sizes) == 1 else EnumeratedDim(enumerated=sizes) for sizes in columns]


def _largest(dim) -> int | None:
    if isinstance(dim, int):
        return dim
    if isinstance(dim, EnumeratedDim):
        return max(dim.enumerated)
    if isinstance(dim, RangeDim):
        return dim.range[1]
    return None  # a symbolic name: its size comes from the model


class InputSpec(Strict):
    """A model input: its shape (positive ints pin dynamic dims) and dtype, or a fixed ``value`` folded at build time."""

    shape: Optional[Union[Annotated[list[Dim], Field(max_length=MAX_RANK)], EnumeratedShapes]] = Field(
        default=None, description="one entry per dim, or {enumerated: [[...], ...]}: exactly these whole shapes")
    dtype: Literal[DTYPES] = "float32"
    value: Any = None

    @model_validator(mode="after")
    def _not_huge(self):
        if isinstance(self.shape, EnumeratedShapes):
            largest = max(math.prod(shape) for shape in self.shape.enumerated)
        else:
            known = [s for s in (_largest(d) for d in self.shape or ()) if s is not None]
            largest = math.prod(known) if known else 0
        if largest > MAX_ELEMENTS:
            raise ValueError(f"the shape has {largest:,} elements at its largest; the limit is {MAX_ELEMENTS:,}")
        return self

    @property
    def dims(self) -> Optional[list]:
        """The shape as one entry per dim (a whole-shape enumeration as per-dim sizes), or None."""
        return self.shape.dims() if isinstance(self.shape, EnumeratedShapes) else self.shape


class Source(Strict):
    model: str = Field(description="path, pypi:NAME==VERSION#path/in/wheel, or https://... (sha256 required)")
    sha256: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                  description="sha256 of the model file; required for pypi: and https: sources")
    format: Optional[str] = Field(default=None, min_length=1,
                                  description="the frontend that reads the model (onnx, pytorch, or a plugin's); "
                                              "inferred from the file suffix when omitted")
    inputs: dict[str, InputSpec] = {}
    options: dict[str, Any] = Field(default={}, description="frontend-specific options, validated by the frontend plugin")


class Target(Strict):
    backend: Optional[str] = Field(default=None, min_length=1,
                                   description="the backend plugin that builds the artifact; default: the installed "
                                               "backend that says it is the default (Core ML)")
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
    unit: ComputeUnit


class Compute(Strict):
    policy: ComputePolicy = "auto"
    chip: str = Field(default="m3", description="chip profile for the compute plan; the backend knows which exist")
    overrides: list[ComputeOverride] = []
    rewrites: dict[str, bool] = Field(default={}, description="ANE-friendly rewrites to enable, by the backend's names")
    fp16_guard: bool = Field(default=True, description="keep ops whose activations leave the fp16 range in fp32")


# How much the optimize stage (and a backend's own rewrites) may do; each graph pass declares the
# lowest level it runs at. O2 is the build every recipe got before levels existed.
OptimizeLevel = Literal["O0", "O1", "O2", "O3"]
OPTIMIZE_LEVELS: tuple[str, ...] = get_args(OptimizeLevel)


class Optimize(Strict):
    level: OptimizeLevel = Field(
        default="O2", description="O0: only what lowering needs; O1: + folding and simplification; "
                                  "O2: + the default fusions; O3: everything, default-off passes and the "
                                  "backend's opt-in rewrites included (see docs/optimize.md)")
    passes: dict[str, bool] = Field(default={}, description="switch graph passes on or off by name; "
                                                            "a switch wins over the level")


class Quantization(Strict):
    """How a quantised source graph (onnxruntime's QDQ, QOperator or dynamic quantisation) is built.

    Its weights always stay quantised in the artifact. ``keep`` reproduces the source's activation
    arithmetic (quantise, round, clip, dequantise, with calibrated or run-time scales); ``float``
    builds weight-only: the activations' quantise/dequantise pairs are removed and they stay float.
    """

    activations: Literal["keep", "float"] = Field(
        default="keep", description="keep: quantise activations as the source does; float: weight-only, "
                                    "activations stay float")


class Metadata(Strict):
    author: Optional[str] = None
    license: Optional[str] = None
    description: Optional[str] = None
    version: Optional[str] = None


class Outputs(Strict):
    dir: Optional[str] = Field(
        default=None,
        description="default: build/<name>, relative to the recipe. Taken as written: `~` and `$VARS` are "
                    "refused, not expanded, so a recipe means the same on every machine")

    @field_validator("dir")
    @classmethod
    def _as_written(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and (value.startswith("~") or re.search(r"\$(\w|\{)", value)):
            raise ValueError(f"{value!r}: edgebuild does not expand ~ or $VARIABLES in recipes; write the path "
                             "out, relative to the recipe (e.g. build/NAME) or absolute")
        return value


class Matrix(BaseModel):
    """Axes of choices; every combination becomes a variant named by its values (``fp16-m3-int8``).
    Any other axis maps value names to overrides of the whole recipe (see Matrix builds)."""

    model_config = ConfigDict(extra="allow")

    precision: Optional[list[Literal["float16", "float32"]]] = Field(
        default=None, min_length=1, description="target.precision values; named fp16, fp32")
    deployment_targets: Optional[list[Literal[DEPLOYMENT_TARGETS]]] = Field(
        default=None, min_length=1, description="target.deployment_target values; named in lower case (ios17)")
    chips: Optional[list[str]] = Field(default=None, min_length=1, description="compute.chip values")
    compression: Optional[dict[str, Optional[dict[str, Any]]]] = Field(
        default=None, min_length=1, description="named compression sections (null: no compression)")
    exclude: list[dict[str, str]] = Field(
        default=[], description="combinations to leave out, e.g. {precision: float32, chips: a17}")
    __pydantic_extra__: dict[str, dict[str, Optional[dict[str, Any]]]]


class Recipe(Strict):
    """One buildable recipe (a variant, after merging)."""

    edgebuild: Literal[1] = Field(description="recipe format version")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    extends: Optional[str] = Field(default=None, description="a base recipe file, relative to this one (chains of at most 16 files)")
    source: Source
    target: Target = Target()
    compute: Compute = Compute()
    optimize: Optimize = Optimize()
    quantization: Quantization = Quantization()
    compression: Optional[dict[str, Any]] = Field(default=None, description="weight compression, validated by the backend plugin")
    generate: Optional[GenerateSection] = Field(default=None, description="build a decoder as a stateful "
                                                "artifact with its KV cache in states (iOS18+)")
    validate_: Optional[ValidateSection] = Field(default=None, alias="validate")
    variants: dict[str, Optional[dict[str, Any]]] = Field(
        default={}, description="named partial overrides, deep-merged onto the base; a name is letters, digits, "
                                "'_', '-' and '.' (starting with a letter, digit or '_'), not '.' or '..'",
        json_schema_extra={"propertyNames": {"pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"}})
    matrix: Optional[Matrix] = Field(default=None, description="axes expanded into one variant per combination, "
                                                                "beside any named variants")
    outputs: Outputs = Outputs()
    metadata: Metadata = Metadata()

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)
