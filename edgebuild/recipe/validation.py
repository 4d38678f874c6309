"""The recipe's ``validate`` section: which inputs to feed, which limits to hold the outputs to.

Every model forbids unknown keys so a typo (``cosine_mni``) is a recipe error, not a silently
ignored limit, and every number must be finite and inside its metric's domain (a ``cosine_min``
above 1 could never pass, one below -1 could never fail). Thresholds left out are not checked:
an empty ``thresholds`` means "report only". Counts have upper bounds (``MAX_SAMPLES``...) so a
slip of the keyboard cannot ask for more memory than any machine has.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_SAMPLES = 10_000
MAX_TOKENS = 1_000_000  # token sequence length
MAX_VOCAB = 2**31  # token ids are int32 on the device
MAX_IMAGE_SIDE = 16_384
MAX_PROMPTS = 1_000
MAX_NEW_TOKENS = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)  # as model.Strict


class RandomInput(_Strict):
    """Random tensors with the input's shape and dtype.

    ``uniform`` draws from ``[low, high)`` (integers for integer dtypes); ``normal`` draws
    ``mean + std * N(0, 1)`` and, when ``low``/``high`` are given, clips to them.
    """

    distribution: Literal["uniform", "normal"] = "uniform"
    low: Optional[float] = None
    high: Optional[float] = None
    mean: float = 0.0
    std: float = Field(default=1.0, ge=0.0)
    seed: int = Field(default=0, ge=0, lt=2**64)

    @model_validator(mode="after")
    def _ordered(self):
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class SpecialTokens(_Strict):
    """Ids wrapped around the real tokens, e.g. BERT's [CLS]=101 and [SEP]=102."""

    first: Optional[int] = None
    last: Optional[int] = None


class TokensInput(_Strict):
    """Token id sequences: ``first``, random ids, ``last``, then ``pad`` up to ``length``.

    ``real_tokens`` fixes how many ids precede the padding (specials included); by default each
    sample picks a length between half and all of ``length``. ``length`` defaults to the input's
    last dimension.
    """

    vocab_size: int = Field(ge=2, le=MAX_VOCAB)
    seed: int = Field(default=0, ge=0, lt=2**64)
    special: SpecialTokens = SpecialTokens()
    pad: int = 0
    length: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)
    real_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)


class ImagesInput(_Strict):
    """Images from a folder (``.npy`` always; PNG/JPEG when Pillow is installed), one per sample.

    Pixels are divided by ``scale``, then normalised per channel with ``mean``/``std``.
    ``size`` is ``[height, width]``; default: taken from the input's shape.
    """

    dir: str
    size: Optional[tuple[Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)], Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE)]]] = None
    mean: Optional[list[float]] = None
    std: Optional[list[float]] = None
    layout: Literal["nchw", "nhwc"] = "nchw"
    scale: float = Field(default=255.0, gt=0.0)

    @field_validator("std")
    @classmethod
    def _nonzero(cls, value):
        if value is not None and any(s == 0 for s in value):
            raise ValueError("std entries must be non-zero")
        return value


INPUT_KINDS = ("random", "tokens", "value", "images", "file")


class InputSource(_Strict):
    """Where one model input's sample values come from: exactly one of ``random``, ``tokens``,
    ``value``, ``images`` or ``file`` (``.npy``, or ``.npz`` with ``key``, default: the input's name).
    """

    random: Optional[RandomInput] = None
    tokens: Optional[TokensInput] = None
    value: Any = None
    images: Optional[ImagesInput] = None
    file: Optional[str] = None
    key: Optional[str] = None

    @field_validator("value")
    @classmethod
    def _no_nan(cls, value):
        # NaN fed to both sides makes both NaN and proves nothing (verify.inputs); inf is kept (masks)
        if value is None:
            return value
        import numpy as np  # here, not at the top: a fully cached run loads no numpy

        try:
            numbers = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):  # not numbers: checked against the input's dtype later
            return value
        if np.isnan(numbers).any():
            raise ValueError("validation inputs contain NaN: both sides would compute NaN and the comparison would "
                             "prove nothing; give finite values (inf is kept, e.g. for an additive mask)")
        return value

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [kind for kind in INPUT_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(INPUT_KINDS)} (got {', '.join(given) or 'none'})")
        if self.key is not None and self.file is None:
            raise ValueError("'key' only applies to 'file' inputs (.npz archives)")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in INPUT_KINDS if getattr(self, kind) is not None)


class TokenizerPrompts(_Strict):
    """Prompts as text, turned into token ids by a Hugging Face ``tokenizer.json`` shipped beside the
    model (read with the ``tokenizers`` library)."""

    tokenizer: str = Field(description="a tokenizer.json file, relative to the recipe")
    texts: list[str] = Field(min_length=1, max_length=MAX_PROMPTS, description="one prompt per text")
    add_special_tokens: bool = Field(default=True, description="let the tokenizer add its BOS/EOS tokens")


TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=MAX_VOCAB)]], Field(min_length=1, max_length=MAX_TOKENS)]


class GenerationValidation(_Strict):
    """``validate.generation``: how a generative (``generate:``) recipe is validated. Artifact and source
    each generate ``new_tokens`` greedily from every prompt; the tokens and each step's logits are compared
    (``thresholds.token_agreement_min``, ``thresholds.step_cosine_min``)."""

    prompts: list[TokenIds] | TokenizerPrompts = Field(
        description="token id lists, or {tokenizer: FILE, texts: [...]}")
    new_tokens: int = Field(default=16, ge=1, le=MAX_NEW_TOKENS, description="tokens each side generates per prompt")

    @field_validator("prompts")
    @classmethod
    def _some(cls, value):
        if isinstance(value, list) and not 1 <= len(value) <= MAX_PROMPTS:
            raise ValueError(f"give between 1 and {MAX_PROMPTS} prompts")
        return value


# -- which statistic over the samples a limit is held against (see thresholds.py) -----------
Aggregation = Literal["worst", "mean", "median", "p1", "p10", "p90", "p99"]
LimitedMetric = Literal["cosine", "max_abs", "mean_abs", "p99_abs", "max_rel", "snr_db", "top1_agreement", "top5_agreement",
                        "noise_ratio", "box_match", "box_recall", "box_precision", "box_iou", "box_score_diff"]
# An agreement limit is a rate over the samples; an error limit holds for every sample.
DEFAULT_AGGREGATION: dict[str, str] = {"top1_agreement": "mean", "top5_agreement": "mean"}


def aggregation_of(aggregate: Optional[dict[str, str]], metric: str) -> str:
    """The statistic ``metric``'s limit is held against: the recipe's choice, else the default."""
    return (aggregate or {}).get(metric) or DEFAULT_AGGREGATION.get(metric, "worst")
# ------------------------------------------------------------------------------------------


class Thresholds(_Strict):
    """Limits on the aggregated metrics. ``*_min`` is held against the lowest sample and ``*_max``
    against the highest ("worst"), except the top-k agreements, held against their mean over the
    samples (the agreement rate); ``aggregate`` picks another statistic per metric. Omitted limits
    are reported but not enforced.
    """

    cosine_min: Optional[float] = Field(default=None, ge=-1.0, le=1.0, description="cosine similarity, in [-1, 1]")
    max_abs_max: Optional[float] = Field(default=None, ge=0.0, description="an error limit, >= 0")
    mean_abs_max: Optional[float] = Field(default=None, ge=0.0, description="an error limit, >= 0")
    p99_abs_max: Optional[float] = Field(default=None, ge=0.0, description="an error limit, >= 0")
    max_rel_max: Optional[float] = Field(default=None, ge=0.0, description="an error limit, >= 0")
    snr_db_min: Optional[float] = Field(default=None, description="decibels, any finite number")
    top1_agreement_min: Optional[float] = Field(default=None, ge=0.0, le=1.0, description="a rate, in [0, 1]")
    top5_agreement_min: Optional[float] = Field(default=None, ge=0.0, le=1.0, description="a rate, in [0, 1]")
    noise_ratio_max: Optional[float] = Field(
        default=None, gt=0.0, description="with reference: float64, the artifact's max abs error from the float64 "
        "answer over onnxruntime fp32's own (2.0: at most twice as far from the exact answer as onnxruntime is)")
    token_agreement_min: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="generation (validate.generation): the share of the artifact's "
        "greedy tokens equal to the source's, held for every prompt (default 1.0)")
    step_cosine_min: Optional[float] = Field(
        default=None, ge=-1.0, le=1.0, description="generation (validate.generation): the lowest cosine between the "
        "artifact's and the source's logits at one step, up to the first divergent token (default: cosine_min)")
    box_match_min: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="detections (validate.detections): the lower of box_recall and "
        "box_precision, in [0, 1]")
    box_recall_min: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="detections: the share of the reference's counted boxes matched "
        "by a candidate box of the same label, in [0, 1]")
    box_precision_min: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="detections: the share of the candidate's counted boxes matched "
        "by a reference box, in [0, 1]")
    box_iou_min: Optional[float] = Field(
        default=None, ge=0.0, le=1.0, description="detections: the mean IoU of the matched pairs, in [0, 1]")
    box_score_diff_max: Optional[float] = Field(
        default=None, ge=0.0, description="detections: the largest score difference of a matched pair, >= 0")
    aggregate: Optional[dict[LimitedMetric, Aggregation]] = Field(
        default=None, description="per metric, the statistic over the samples its limit is held against: "
        "worst (default; mean for top1/top5_agreement), mean, median or a percentile p1, p10, p90, p99")

    def merged(self, override: "Thresholds | None") -> "Thresholds":
        """These limits with ``override``'s explicitly set ones on top."""
        if override is None:
            return self
        update = override.model_dump(exclude_unset=True)
        if "aggregate" in update:
            update["aggregate"] = {**(self.aggregate or {}), **(override.aggregate or {})}
        return self.model_copy(update=update)


GENERATION_LIMITS = ("token_agreement_min", "step_cosine_min")  # held by verify.generation, not per output


class OutputOverride(_Strict):
    thresholds: Thresholds = Thresholds()


class DetectionOutputs(_Strict):
    """``validate.detections[]``: a detector's outputs, compared as detections rather than element by
    element (after NMS a last-bit difference changes which boxes survive, and in what order). Each
    reference box, highest score first, is matched to the unmatched candidate box of the same label
    with the highest IoU, at least ``iou``; the box metrics (box_match, box_recall, box_precision,
    box_iou, box_score_diff) go to the ``boxes`` output, and every output of the group gets the
    ordinary metrics over the matched pairs. Borderline boxes, which a last-bit difference may
    legitimately add or drop, count when matched and are ignored when not: scores within
    ``score_margin`` of the score cut, and boxes that overlap a higher-scored box of their label
    by ``nms_iou - nms_margin`` or more.
    """

    boxes: str = Field(description="the output of boxes, [..., N, 4] as x1, y1, x2, y2; leading dims are batch dims")
    scores: Optional[str] = Field(default=None, description="the output of scores, [..., N]")
    labels: Optional[str] = Field(default=None, description="the output of class labels, [..., N]: "
                                  "boxes match only boxes of their label")
    attached: list[str] = Field(default=[], description="outputs indexed by detection, [..., N, ...] (masks, "
                                "keypoints): compared over the matched pairs")
    iou: float = Field(default=0.5, gt=0.0, le=1.0, description="the IoU at which two boxes match")
    score_threshold: Optional[float] = Field(
        default=None, description="the model's own score cut (torchvision: box_score_thresh or score_thresh); "
        "boxes scored within score_margin above it are borderline")
    score_margin: float = Field(default=0.01, ge=0.0, description="how close to the score cut a score is borderline")
    max_detections: Optional[int] = Field(
        default=None, ge=1, description="the model's cap on detections per image (torchvision: "
        "detections_per_img): a side that is full cuts at its lowest score, which then acts as the score cut")
    nms_iou: Optional[float] = Field(
        default=None, gt=0.0, le=1.0, description="the model's NMS IoU threshold: a box that overlaps a "
        "higher-scored box of its label by nms_iou - nms_margin or more is borderline")
    nms_margin: float = Field(default=0.01, ge=0.0, description="how close to nms_iou an overlap is borderline")

    @property
    def outputs(self) -> list[str]:
        """Every output of the group, boxes first."""
        return [name for name in (self.boxes, self.scores, self.labels, *self.attached) if name is not None]

    @model_validator(mode="after")
    def _distinct(self):
        names = self.outputs
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"output {', '.join(map(repr, repeated))} is named twice: each output plays one role")
        return self

    @model_validator(mode="after")
    def _score_cuts_need_scores(self):
        if self.scores is None and (self.score_threshold is not None or self.max_detections is not None):
            raise ValueError("score_threshold and max_detections cut by score: name the scores output too")
        return self


class ValidateSection(_Strict):
    """``validate:`` in a recipe."""

    samples: int = Field(default=8, ge=1, le=MAX_SAMPLES, description="how many input samples to compare")
    inputs: dict[str, InputSource] = Field(
        default={}, description="per model input; inputs not listed get uniform random values in [0, 1)"
    )
    thresholds: Thresholds = Thresholds()
    per_output: dict[str, OutputOverride] = Field(default={}, description="per-output threshold overrides")
    detections: list[DetectionOutputs] = Field(
        default=[], description="detectors' outputs (boxes, scores, labels), compared by IoU matching instead of "
        "element by element; held to the box_* thresholds")
    runtimes: Optional[list[str]] = Field(
        default=None,
        min_length=1,
        description="candidate runtimes to run, by the backend's names (Core ML: interpreter, coreml); default: "
                    "every one the backend offers, and those this OS cannot run are reported as skipped",
    )
    reference: Literal["float32", "float64", "none"] = Field(
        default="float32",
        description="what the artifact is measured against: float32, onnxruntime on the source (the usual "
                    "reference; onnx's reference evaluator with the plugins' op references for a source with "
                    "custom ops); float64, the source evaluated in float64 (onnxruntime where it has double "
                    "kernels, onnx's reference evaluator otherwise), with onnxruntime fp32's own distance from "
                    "it reported beside the artifact's and held to noise_ratio_max; none, nothing: the "
                    "variant is built, not validated, with a warning in its report (a custom op without "
                    "a registered reference)",
    )
    fp16_emulation: Literal["auto", "on", "off"] = Field(
        default="auto", description="round interpreter activations to fp16 (auto: when the artifact is fp16)"
    )
    generation: Optional[GenerationValidation] = Field(
        default=None, description="generative recipes (generate:): prompts both sides continue greedily, and how far")

    @field_validator("fp16_emulation", mode="before")
    @classmethod
    def _yaml_booleans(cls, value):
        # YAML 1.1 reads bare on/off as booleans.
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value

    @model_validator(mode="after")
    def _noise_ratio_needs_float64(self):
        limited = [self.thresholds, *(o.thresholds for o in self.per_output.values())]
        if self.reference != "float64" and any(t.noise_ratio_max is not None for t in limited):
            raise ValueError("noise_ratio_max compares with a float64 evaluation of the source: "
                             "set validate.reference: float64")
        return self

    @model_validator(mode="after")
    def _generation_limits_need_generation(self):
        limited = [("thresholds", self.thresholds),
                   *((f"per_output.{name}.thresholds", o.thresholds) for name, o in self.per_output.items())]
        for where, limits in limited:
            for name in GENERATION_LIMITS:
                if getattr(limits, name) is not None and (self.generation is None or where != "thresholds"):
                    raise ValueError(f"{where}.{name} limits generation validation: set it in validate.thresholds "
                                     "of a recipe with validate.generation")
        return self

    @model_validator(mode="after")
    def _one_detection_group_per_output(self):
        seen: dict[str, int] = {}
        for index, group in enumerate(self.detections):
            for name in group.outputs:
                if name in seen:
                    raise ValueError(f"detections[{index}] names output '{name}', which detections[{seen[name]}] "
                                     "names too: an output belongs to one detector")
                seen[name] = index
        return self

    def thresholds_for(self, output: str) -> Thresholds:
        """The limits that apply to ``output``: the global ones with its override on top."""
        override = self.per_output.get(output)
        return self.thresholds.merged(override.thresholds if override else None)
