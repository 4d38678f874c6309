"""The recipe's ``compression`` section, as this plugin understands it.

The core validates the section into these models once, when the recipe loads (the plugin
registers ``CompressionSection`` as ``coreml:compression``), maps pydantic's errors to
file:line and runs ``check_recipe``; the compress stage and every algorithm below it receive
the validated models. ``validate_compression`` does the same for a mapping given in code.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from edgebuild.plugin import RecipeError, RecipeSection
from edgebuild.plugin.recipe import OpMatch

from .gating import check_deployment_target

PALETTE_NBITS = (1, 2, 3, 4, 6, 8)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PalettizeWeights(_Strict):
    """Weights become indices into a look-up table of 2^nbits entries (per tensor or group)."""

    mode: Literal["palettize"]
    nbits: int | None = None
    granularity: Literal["per_tensor", "per_grouped_channel"] = "per_tensor"
    group_size: int = Field(32, gt=0)
    # kmeans: this plugin's fast 1-D k-means; kmeans_coremltools: coremltools' own k-means
    # (scikit-learn, or its exact 1-D solver for float16 groups of 10,000+), for comparison.
    algorithm: Literal["kmeans", "kmeans_coremltools", "uniform", "unique"] = "kmeans"
    cluster_dim: int = Field(1, ge=1)
    per_channel_scale: bool = False

    @field_validator("nbits")
    @classmethod
    def _nbits_supported(cls, nbits: int | None) -> int | None:
        if nbits is not None and nbits not in PALETTE_NBITS:
            raise PydanticCustomError("nbits", "must be one of 1, 2, 3, 4, 6, 8")
        return nbits

    @model_validator(mode="after")
    def _nbits_matches_algorithm(self) -> PalettizeWeights:
        if self.algorithm == "unique" and self.nbits is not None:
            raise ValueError("algorithm 'unique' picks nbits itself; remove nbits")
        if self.algorithm != "unique" and self.nbits is None:
            raise ValueError(f"algorithm {self.algorithm!r} needs nbits (1, 2, 3, 4, 6 or 8)")
        if self.algorithm == "uniform" and self.cluster_dim > 1:
            raise ValueError("algorithm 'uniform' cannot do vector palettisation (cluster_dim > 1)")
        return self


class LinearWeights(_Strict):
    """Weights become integers with a scale (and offset unless symmetric)."""

    mode: Literal["linear"]
    dtype: Literal["int8", "int4", "uint8", "uint4"] = "int8"
    granularity: Literal["per_tensor", "per_channel", "per_block"] = "per_channel"
    block_size: int = Field(32, gt=0)
    symmetric: bool = True


class PruneWeights(_Strict):
    """Small weights become zeros stored sparsely; ``then`` compresses the survivors (joint)."""

    mode: Literal["prune"]
    method: Literal["threshold", "magnitude", "n_m"] = "threshold"
    threshold: float = Field(1e-3, ge=0)
    target_sparsity: float | None = Field(None, gt=0, lt=1)
    n_m: tuple[int, int] | None = None
    then: Annotated[Union[PalettizeWeights, LinearWeights], Field(discriminator="mode")] | None = None

    @model_validator(mode="after")
    def _method_has_its_parameter(self) -> PruneWeights:
        if self.method == "magnitude" and self.target_sparsity is None:
            raise ValueError("method 'magnitude' needs target_sparsity (between 0 and 1)")
        if self.method == "n_m":
            if self.n_m is None:
                raise ValueError("method 'n_m' needs n_m: [n, m], e.g. [2, 4]")
            n, m = self.n_m
            if not 0 < n <= m:
                raise ValueError(f"n_m must satisfy 0 < n <= m, got [{n}, {m}]")
        return self


WeightCompression = Annotated[
    Union[PalettizeWeights, LinearWeights, PruneWeights], Field(discriminator="mode")
]


class ActivationCompression(_Strict):
    """W8A8: activations quantised with ranges calibrated on the recipe's validation inputs."""

    mode: Literal["linear"] = "linear"
    dtype: Literal["int8"] = "int8"
    calibration: Literal["validate"] = "validate"


class OverrideMatch(OpMatch):
    """Which ops an override applies to: a MIL op type and/or a regex over op names, or a role
    found by the model's structure (``lm_head``: the projection producing the ``logits`` output,
    with the embedding gather when the two share their table)."""

    role: Literal["lm_head"] | None = None

    @model_validator(mode="after")
    def _matches_something(self) -> OverrideMatch:
        if self.role is not None and (self.op_type is not None or self.name is not None):
            raise ValueError("match by role alone: remove op_type and name")
        if self.op_type is None and self.name is None and self.role is None:
            raise ValueError("match needs op_type, name, both, or role")
        return self


class Override(_Strict):
    """Compression for matched ops; ``weights: null`` leaves them uncompressed."""

    match: OverrideMatch
    weights: WeightCompression | None


class KeepWeights(_Strict):
    """An ``auto`` candidate that leaves a layer's weights as they are (fp16 or fp32)."""

    mode: Literal["none"]


AutoCandidate = Annotated[Union[PalettizeWeights, LinearWeights, KeepWeights], Field(discriminator="mode")]


def _default_candidates() -> list:
    # Everything here runs on iOS16: per-tensor palettes and per-channel int8.
    return [
        PalettizeWeights(mode="palettize", nbits=4),
        PalettizeWeights(mode="palettize", nbits=6),
        PalettizeWeights(mode="palettize", nbits=8),
        LinearWeights(mode="linear", dtype="int8"),
        KeepWeights(mode="none"),
    ]


class AutoCompression(_Strict):
    """Per-layer modes chosen from ``candidates`` to meet a size or an error budget.

    ``max_size_mb`` (10^6 bytes of the saved package) -> least output error;
    ``max_error`` (``metric`` of the outputs against the uncompressed model) -> smallest size.
    """

    max_size_mb: float | None = Field(None, gt=0)
    max_error: float | None = Field(None, gt=0)
    metric: Literal["cosine_distance", "rel_l2", "max_abs"] = "cosine_distance"
    candidates: list[AutoCandidate] = Field(default_factory=_default_candidates, min_length=1)
    samples: int = Field(4, ge=1, description="calibration samples from the validate inputs")
    sensitivity: Literal["auto", "forward", "activations"] = Field(
        "auto",
        description="forward: the whole model run per layer and candidate; activations: each layer's own op "
        "on inputs captured in one run (for models of many layers); auto: forward while layers x candidates <= 64",
    )

    @model_validator(mode="after")
    def _one_budget_and_supported_candidates(self) -> AutoCompression:
        if (self.max_size_mb is None) == (self.max_error is None):
            raise ValueError("auto needs exactly one budget: max_size_mb or max_error")
        for candidate in self.candidates:
            if isinstance(candidate, PalettizeWeights) and (
                candidate.algorithm != "kmeans" or candidate.cluster_dim != 1 or candidate.per_channel_scale
            ):
                raise ValueError(
                    "auto palettize candidates use algorithm kmeans, cluster_dim 1, no per_channel_scale"
                )
        return self


class CompressionSection(_Strict, RecipeSection):
    """The whole ``compression`` section of a recipe."""

    weights: WeightCompression | None = None
    weight_threshold: int = Field(2048, ge=0)
    activations: ActivationCompression | None = None
    overrides: list[Override] = Field(default_factory=list)
    auto: AutoCompression | None = None

    def check_recipe(self, recipe) -> None:
        """Checks that need the rest of the recipe: every mode (auto candidates included) must
        exist on the deployment target. The only place the target is checked."""
        check_deployment_target(self, recipe.target.deployment_target)
        if self.activations is not None and recipe.target.precision != "float16":
            # coremltools' activation quantisation writes fp16 scales, which fp32 activations cannot take
            raise RecipeError(
                f"activation quantisation (W8A8) needs float16 activations; target.precision is "
                f"{recipe.target.precision}",
                hint="set target.precision: float16 in the variant with compression.activations",
            )

    @model_validator(mode="after")
    def _auto_chooses_weights_alone(self) -> CompressionSection:
        if self.auto is not None:
            taken = [name for name in ("weights", "overrides", "activations") if getattr(self, name)]
            if taken:
                raise ValueError(f"auto chooses every layer's weights itself; remove {', '.join(taken)}")
        return self


def validate_compression(data: dict, *, target: str | None = None) -> CompressionSection:
    """Validate a ``compression`` mapping (pydantic.ValidationError); with ``target``, also check
    every mode exists on that deployment target (RecipeError), as loading a recipe does."""
    section = CompressionSection.model_validate(data)
    if target is not None:
        check_deployment_target(section, target)
    return section
