"""What a variant's ``report.json`` holds: one schema for the build that writes it
(``edgebuild.build.run``) and the page that reads it (``html.py``), so a section cannot silently
go missing because the two sides spelt a key differently.

Every section is optional (a variant without compression has no ``compression``), but a
section that is present must have its fields: the compressor's per-weight sizes without
``bytes_before``, say, fail the build instead of leaving the page without its chart.
Beside the sections, the report keeps each stage's own record under the stage's name
(``lower``, ``compress``, ...); any other top-level key is an error.

In ``report.json`` non-finite floats are the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (JSON
has no such numbers; an SNR of identical outputs is ``inf``); reading turns them back.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgebuild.report.verdict import compared, verdict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A stage's record: the fields the page reads are typed, the rest is kept as written."""

    model_config = ConfigDict(extra="allow")


class Source(_Section):
    model: str
    sha256: Optional[str] = None  # of the file that was built


class Target(_Section):
    backend: str
    deployment_target: Optional[str] = None
    precision: Optional[str] = None


class Compute(_Section):
    policy: Optional[str] = None
    chip: Optional[str] = None


class Artifact(_Section):
    path: str
    kind: str = ""
    size_bytes: Optional[int] = None


class StageRun(_Section):
    name: str
    status: str  # "ran" | "cached"
    seconds: float = 0.0
    key: Optional[str] = None


class WeightSize(_Open):
    """One weight as the compress stage reports it."""

    name: str
    bytes_before: int
    bytes_after: int
    op_type: Optional[str] = None
    mode: Optional[str] = None


class Compression(_Open):
    """The compress stage's record: every weight's size before and after, and what was applied in
    words (``int8 linear weights, per-channel``)."""

    weights: list[WeightSize]
    bytes_before: Optional[int] = None
    bytes_after: Optional[int] = None
    applied: Optional[str] = None

    @property
    def compressed(self) -> int:
        """How many weights a compression mode changed."""
        return sum(1 for w in self.weights if w.mode not in (None, "none"))

    @property
    def total_before(self) -> int:
        return self.bytes_before if self.bytes_before is not None else sum(w.bytes_before for w in self.weights)

    @property
    def total_after(self) -> int:
        return self.bytes_after if self.bytes_after is not None else sum(w.bytes_after for w in self.weights)

    @property
    def ratio(self) -> Optional[float]:
        """How many times smaller the weights became (None when nothing is left to divide by)."""
        return self.total_before / self.total_after if self.total_after else None


class Quantization(_Section):
    """What the optimise stage did with a quantised source graph."""

    activations: Literal["keep", "float"]  # the recipe's quantization.activations
    activation_pairs_removed: int = 0  # quantise/dequantise pairs of activations taken out (float)
    weights_quantized: int = 0  # weights left quantised (DequantizeLinear of integer constants)

    @property
    def summary(self) -> str:
        """One line: what kind of build this was."""
        if self.activations == "float":
            return (f"weight-only: {self.weights_quantized} quantised weights kept, "
                    f"{self.activation_pairs_removed} activation quantise/dequantise pairs removed (activations float)")
        return f"{self.weights_quantized} quantised weights kept; activations quantised as in the source"

    @property
    def applies(self) -> bool:
        """Whether the source was quantised at all (a float model has nothing to say here)."""
        return bool(self.weights_quantized or self.activation_pairs_removed)


class OptimizeRecord(_Open):
    """The optimise stage's record: op counts and rules fired (kept as written), and quantisation."""

    quantization: Optional[Quantization] = None


class Failure(_Section):
    """One unmet limit: ``value`` (the ``statistic`` over the samples) against ``limit``."""

    output: str
    metric: str
    value: Optional[float] = None
    limit: Optional[float] = None
    runtime: Optional[str] = None
    statistic: str = "worst"
    message: str = ""
    prompt: Optional[int] = None  # generation validation: which prompt (its index) ...
    step: Optional[int] = None  # ... and at which generated step


class Histogram(_Section):
    edges: list[float]
    counts: list[int]


class Distances(_Section):
    cosine: float
    max_abs: float


class Float64Distances(_Section):
    """One output of one sample, against the source evaluated in float64."""

    candidate: Distances
    fp32_reference: Distances
    noise_ratio: float


class Float64Check(_Section):
    """Written when a distance limit failed against the fp32 reference: both sides measured against
    a float64 evaluation on the worst sample, or why that could not be done."""

    sample: Optional[int] = None
    evaluator: Optional[str] = None
    outputs: dict[str, Float64Distances] = {}
    skipped: Optional[str] = None


class PromptGeneration(_Section):
    """One prompt continued greedily by the artifact and by the source."""

    prompt: list[int]
    text: Optional[str] = None  # the prompt as written, when a tokenizer made the ids
    artifact_tokens: list[int]
    source_tokens: list[int]
    step_cosine: list[float]  # logits cosine per step, up to and including the first divergence
    first_divergence: Optional[int] = None  # None: every token agrees
    agreement: float  # share of steps with equal tokens


class Generation(_Section):
    """Validation by generation (generative recipes): per prompt, and the figures over all prompts."""

    new_tokens: int
    worst_step_cosine: float
    mean_agreement: float
    first_divergence: Optional[int] = None
    prompts: list[PromptGeneration]


class RuntimeRecord(_Section):
    """One candidate runtime's comparison with the reference, or why it was skipped."""

    metrics: dict[str, dict[str, dict[str, float]]] = {}  # output -> metric -> statistic -> value
    failures: list[Failure] = []
    limits: dict[str, dict[str, float]] = {}  # output -> threshold name -> limit
    aggregation: dict[str, dict[str, str]] = {}  # output -> metric -> statistic its limit is held against
    histograms: dict[str, Histogram] = {}
    float64_check: Optional[Float64Check] = None
    generation: Optional[Generation] = None
    skipped: Optional[str] = None


class ShapeSet(_Section):
    """One set of samples of a model with flexible inputs: the shapes the inputs had there and
    the lowest cosine per runtime and output."""

    inputs: dict[str, list[int]]
    samples: int
    cosine_min: dict[str, dict[str, float]] = {}  # runtime -> output -> lowest cosine


class Validation(_Open):
    samples: Optional[int] = None
    reference: Optional[str] = None
    runtimes: dict[str, RuntimeRecord] = {}
    failures: list[Failure] = []
    shapes: list[ShapeSet] = []  # empty when every input has one shape
    not_validated: Optional[str] = None  # why nothing was compared (validate.reference: none)
    warnings: list[str] = []

    @field_validator("failures", mode="before")
    @classmethod
    def _structured(cls, failures):
        # reports written before failures were structured held one sentence each
        return [{"output": "", "metric": "", "message": f} if isinstance(f, str) else f for f in failures or []]


class Renaming(_Section):
    """An input or output the artifact names differently from the source model (see docs/start.md, Names)."""

    tensor: Literal["input", "output"]
    onnx: str
    artifact: str
    reason: Optional[str] = None
    segment: Optional[int] = None  # a bundle segment's border; None: the artifact's own input or output


class ComputePlan(_Open):
    ops: list[dict[str, Any]] = []
    breakdown: dict[str, Any] = {}
    total_ms: Optional[float] = None


DTYPE_WORDS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


class Report(_Open):
    """A variant's ``report.json``."""

    recipe: Optional[str] = None
    variant: Optional[str] = None
    status: Optional[Literal["built", "failed"]] = None
    edgebuild_version: Optional[str] = None
    recipe_path: Optional[str] = None
    source: Optional[Source] = None
    target: Optional[Target] = None
    compute: Optional[Compute] = None
    versions: dict[str, str] = {}  # edgebuild and every plugin whose code made a stage
    artifact: Optional[Artifact] = None
    comparison: Optional[str] = Field(default=None, description="the page comparing the recipe's variants, relative to this report")
    stages: list[StageRun] = []
    compression: Optional[Compression] = None
    validation: Optional[Validation] = None
    plan: Optional[ComputePlan] = None
    optimize: Optional[OptimizeRecord] = None
    renamings: list[Renaming] = []
    notes: list[str] = []

    @model_validator(mode="after")
    def _only_stage_records_besides(self):
        stages = {stage.name for stage in self.stages}
        unknown = sorted(set(self.model_extra or {}) - stages)
        if unknown:
            raise ValueError(f"unknown report section(s) {', '.join(unknown)} (neither a field nor a stage's record)")
        return self

    @property
    def verdict(self) -> str:
        """``validation passed``, ``validation failed`` or ``built, not validated``."""
        validated = self.validation is not None and compared(self.validation.runtimes)
        return verdict(failed=self.status == "failed" or bool(self.failures), validated=validated)

    @property
    def source_weights(self) -> tuple[Optional[int], Optional[str]]:
        """Bytes of the source model's weights and their element type in words (``fp32``); None
        where the import stage did not count them."""
        record = (self.model_extra or {}).get("import")
        if not isinstance(record, Mapping) or not isinstance(record.get("weight_bytes"), int):
            return None, None
        dtypes = record.get("weight_dtypes") or {}
        main = max(dtypes, key=dtypes.get) if dtypes else None
        return record["weight_bytes"], DTYPE_WORDS.get(main, main)

    @property
    def ratio_to_source(self) -> Optional[float]:
        """How many times smaller the compressed weights are than the source model's."""
        before, _ = self.source_weights
        after = self.compression.total_after if self.compression is not None and self.compression.weights else None
        return before / after if before and after else None

    @property
    def failures(self) -> list[Failure]:
        """Every runtime's unmet limits."""
        return [f for runtime in (self.validation.runtimes.values() if self.validation else ()) for f in runtime.failures]
