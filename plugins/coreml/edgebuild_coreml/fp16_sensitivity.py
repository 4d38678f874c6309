"""fp16 precision search: the fewest ops to keep in fp32 so the outputs stay within the recipe's cosine limit.

Some models fit the fp16 range but not its precision: each op's fp16 rounding is tiny, but a deep,
badly conditioned net (squeeze-and-excitation gates reading large logits, say) amplifies what the
early layers round off, and the outputs drift below ``validate.thresholds.cosine_min``. The guard
finds that on its calibration samples, before the fp16 cast pass runs:

- the fp32 program runs with its inputs, its weights and every float op's outputs rounded to
  fp16 as it computes (the interpreter's ``observer`` replaces them), except the ops kept in fp32
  and the weights only they read; the outputs' cosine against the plain fp32 run estimates the
  artifact's. The weights count as much as the activations: a convolution with a batch norm
  folded in, whose bias cancels most of its product, loses to both alike;
- when that estimate misses the budget, the ops are cut, in program order, into SEGMENTS
  contiguous runs; each run's sensitivity is the cosine deficit of rounding it alone;
- the most sensitive runs are kept in fp32, as few as meet the budget on every sample (a
  bisection over how many). Contiguous runs make islands with casts only at their ends.

A detector's outputs (``validate.detections``) are judged as validation judges them (``Judge``):
boxes matched by IoU, the cosine over the matched pairs, and each box limit's shortfall put on
the cosine's scale (a box_match at its limit counts as a cosine at cosine_min). A plain cosine
over boxes after NMS measures their order, which a last bit changes, and kept everything fp32.

The estimate is one draw of a chaotic quantity for a badly conditioned net: the artifact's
kernels round and sum in their own order, and a net that amplifies last-bit differences lands
anywhere in a range. So the guard also runs the worst sample twice with each op's outputs
rounded stochastically (an unbiased rounding with the same step as round-to-nearest): where the
three estimates spread by more than the recipe's whole allowed deficit, rounding alone decides
whether the artifact passes, and the result says so (``ill_conditioned``) instead of trusting
one of them. A well-conditioned net spreads by about its deficit, which the search kept to half.

The budget is half the recipe's allowed deficit (``1 - cosine_min``): the estimate sees the
calibration samples, not every validation sample, and rounds where the artifact's kernels round
at most (each op's result; products accumulate in fp32 as Core ML's do).

Memory: the search holds an fp16-rounded copy of the fp32 weights while it runs.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

STOCHASTIC_DRAWS = 2  # stochastic-rounding runs of the worst sample that measure the estimate's spread
SEGMENTS = 16  # contiguous runs of ops the search ranks; more cost a run each, fewer keep coarser islands
BUDGET_SHARE = 0.5  # of the recipe's cosine deficit the estimate may use; the rest is for what it does not see


@dataclass
class PrecisionResult:
    cosine_min: float
    fp16_cosine: float  # estimated worst cosine with only the overflow islands in fp32
    kept_cosine: float  # ... and with ``kept`` in fp32 too
    kept: dict[str, str] = field(default_factory=dict)  # op name -> op type, in program order
    # the worst sample's estimate with ``kept`` in fp32, lowest and highest over the roundings
    spread: tuple[float, float] | None = None
    judged_as: str = "cosine"  # or "detections": boxes matched as validation matches them

    @property
    def ill_conditioned(self) -> bool:
        """Rounding alone moves the outputs by more than the recipe allows: no estimate bounds the artifact."""
        return self.spread is not None and self.spread[1] - self.spread[0] > 1.0 - self.cosine_min

    def kinds(self) -> dict[str, int]:
        return dict(Counter(self.kept.values()).most_common())

    def to_json(self) -> dict:
        found = {"cosine_min": self.cosine_min, "judged_as": self.judged_as,
                 "estimated_fp16_cosine": round(self.fp16_cosine, 7),
                 "estimated_cosine_with_islands": round(self.kept_cosine, 7),
                 "kept_fp32": list(self.kept), "kept_fp32_kinds": self.kinds()}
        if self.spread is not None:
            found["estimate_range"] = [round(value, 7) for value in self.spread]
            found["ill_conditioned"] = self.ill_conditioned
        return found


@dataclass(frozen=True)
class Judge:
    """How the estimate's outputs are held against the fp32 run's: as validation will hold the artifact's.

    ``detections``: the recipe's ``validate.detections`` groups, named by the program's outputs;
    ``box_limits``: {box metric: its lower limit} (box_match, box_iou, ...), from the thresholds."""

    cosine_min: float
    detections: tuple = ()
    box_limits: Mapping[str, float] = field(default_factory=dict)

    def score(self, reference: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> float:
        """One sample's score on the cosine's scale: the lowest cosine, and each box limit's shortfall."""
        if not self.detections:
            return sample_cosine(reference, outputs)
        from edgebuild.plugin.validation import compare

        # an unmatched NaN box would only lower box_match: fp16 making values non-finite fails outright
        if any(np.asarray(expected).dtype.kind == "f" and np.isfinite(expected).all()
               and not np.isfinite(outputs[name]).all() for name, expected in reference.items()):
            return -1.0
        metrics = compare(reference, outputs, detections=self.detections)
        worst = 1.0
        for name, expected in reference.items():
            if np.asarray(expected).dtype.kind != "f":
                continue
            cosine = metrics[name].get("cosine", 1.0)
            if metrics[name].get("nonfinite", 0.0) or not np.isfinite(cosine):
                return -1.0
            worst = min(worst, cosine)
        allowed = 1.0 - self.cosine_min
        for group in self.detections:
            for metric, limit in self.box_limits.items():
                value = metrics[group.boxes].get(metric)
                if value is None:  # no pair, no box_iou: box_match carries it
                    continue
                # at the limit the shortfall counts as a cosine at cosine_min, so both share the budget
                worst = min(worst, 1.0 - (1.0 - value) * allowed / (1.0 - limit) if limit < 1.0
                            else 1.0 if value >= 1.0 else -1.0)
        return worst


BOX_LIMITS = {"box_match": "box_match_min", "box_recall": "box_recall_min",
              "box_precision": "box_precision_min", "box_iou": "box_iou_min"}


def judge_for(section, cosine_min: float, output_names: Mapping[str, str]) -> Judge:
    """The ``Judge`` for a recipe's validate ``section`` (its detections, whose outputs ``output_names``
    maps from the model's names to the program's) and its strictest ``cosine_min``."""
    groups = tuple(getattr(section, "detections", None) or ())
    if not groups:
        return Judge(cosine_min)
    renamed = []
    limits: dict[str, float] = {}
    for group in groups:
        names = {role: output_names.get(value, value) for role in ("boxes", "scores", "labels")
                 if (value := getattr(group, role)) is not None}
        renamed.append(group.model_copy(update={**names, "attached": [output_names.get(n, n) for n in group.attached]}))
        thresholds = section.thresholds_for(group.boxes)
        for metric, field_name in BOX_LIMITS.items():
            limit = getattr(thresholds, field_name)
            if limit is not None:
                limits[metric] = max(limit, limits.get(metric, 0.0))
    return Judge(cosine_min, tuple(renamed), limits)


def stochastic_rounding(seed: int):
    """A rounding of fp32 arrays to fp16 values that picks either neighbour, the nearer more often
    (unbiased: the mean is the value), from a generator seeded with ``seed``."""
    rng = np.random.default_rng(seed)

    def rounded(value: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # beyond fp16: inf, as a cast gives
            nearest = value.astype(np.float16)
            residual = value - nearest.astype(np.float32)
            other = np.nextafter(nearest, np.where(residual > 0, np.float16(np.inf), np.float16(-np.inf)))
            step = other.astype(np.float32) - nearest.astype(np.float32)
            chance = np.where(step != 0, residual / step, 0.0)  # in [0, 1/2]; NaN at inf: nearest
        return np.where(rng.random(value.shape, dtype=np.float32) < chance, other, nearest).astype(np.float32)

    return rounded


class RoundedWeights:
    """The fp32 constants of ``program`` with their fp16-rounded values, swapped in for a run."""

    def __init__(self, program):
        from edgebuild_coreml.interpreter.torch_kernels import round_to_half

        self.program = program
        self.constants = [(var, var.val, round_to_half(np.asarray(var.val, np.float32)))
                          for op in program.functions["main"].operations if op.op_type == "const"
                          for var in op.outputs
                          if var.child_ops and isinstance(var.val, np.ndarray) and var.val.dtype == np.float32]

    @contextmanager
    def applied(self, keep: set[str]):
        """The weights rounded, but those only ops in ``keep`` read (the cast pass leaves them fp32)."""
        from edgebuild_coreml.interpreter.plan import forget_plans

        for var, _, rounded in self.constants:
            if not all(reader.name in keep for reader in var.child_ops):
                var._sym_val.val = rounded
        forget_plans(self.program)  # its plan holds the constants it read
        try:
            yield
        finally:
            for var, original, _ in self.constants:
                var._sym_val.val = original
            forget_plans(self.program)


def emulated_fp16(program, sample: Mapping[str, np.ndarray], keep: set[str], rounding=None) -> dict[str, np.ndarray]:
    """``program``'s (fp32) outputs on ``sample`` with the inputs and every op's float outputs
    rounded to fp16, except the ops named in ``keep`` and the inputs only they read (the
    weights: ``RoundedWeights``). A kept op read by kept and fp16 ops alike counts as fp32 for
    all of them (the estimate's one optimism). ``rounding``: how the ops' outputs are rounded
    (default: to nearest, as a cast does); the inputs are always rounded to nearest."""
    from edgebuild_coreml.interpreter import run_program
    from edgebuild_coreml.interpreter.torch_kernels import round_to_half

    def rounded(value, rounding=round_to_half):
        return rounding(value) if isinstance(value, np.ndarray) and value.dtype == np.float32 else value

    function = program.functions["main"]
    returned = {var.name for var in function.outputs}

    def read_in_fp32(op) -> bool:
        # a kept op only fp16 ops read is cast down by each of them: its value counts as fp16
        return op.name in keep and any(var.name in returned or any(reader.name in keep for reader in var.child_ops)
                                       for var in op.outputs)

    def observe(op, outputs):
        return None if read_in_fp32(op) else [rounded(value, rounding or round_to_half) for value in outputs]

    inputs = function.inputs
    # an input only fp32 ops read is not cast (the cast pass casts it for fp16 readers)
    cast = {name for name, var in inputs.items() if not all(reader.name in keep for reader in var.child_ops)}
    return run_program(program, {name: rounded(np.asarray(value)) if name in cast else value
                                 for name, value in sample.items()}, observer=observe)


def worst_cosine(references: Sequence[Mapping[str, np.ndarray]], got: Sequence[Mapping[str, np.ndarray]],
                 judge: Judge | None = None) -> float:
    """The lowest score over the samples (``Judge.score``; without a judge, ``sample_cosine``)."""
    score = judge.score if judge is not None else sample_cosine
    return min((score(reference, outputs) for reference, outputs in zip(references, got)), default=1.0)


def sample_cosine(reference: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> float:
    """The lowest cosine over one sample's float outputs (1.0 where an output is all zeros both ways)."""
    worst = 1.0
    for name, expected in reference.items():
        expected = np.asarray(expected)
        if expected.dtype.kind != "f":
            continue
        a, b = expected.astype(np.float64).ravel(), np.asarray(outputs[name], np.float64).ravel()
        if not np.isfinite(b).all():
            return -1.0
        norms = float(np.linalg.norm(a) * np.linalg.norm(b))
        worst = min(worst, float(a @ b) / norms if norms > 0 else float(np.array_equal(a, b)))
    return worst


def float_ops(program, exclude: set[str]) -> list:
    """The non-constant ops of ``program``'s main block with a float output, in program order."""
    from coremltools.converters.mil.mil import types

    return [op for op in program.functions["main"].operations
            if op.op_type != "const" and op.name not in exclude
            and any(v.dtype in (types.fp16, types.fp32) for v in op.outputs)]


def segments_of(ops: list, count: int = SEGMENTS) -> list[list]:
    """``ops`` cut into at most ``count`` contiguous runs of near-equal length."""
    bounds = np.linspace(0, len(ops), min(count, len(ops)) + 1).round().astype(int)
    return [ops[start:stop] for start, stop in zip(bounds[:-1], bounds[1:]) if stop > start]


def find_sensitive_ops(program, samples: Sequence[Mapping[str, np.ndarray]],
                       references: Sequence[Mapping[str, np.ndarray]], *, cosine_min: float,
                       keep: set[str], judge: Judge | None = None) -> PrecisionResult:
    """The fewest ops (besides ``keep``, already fp32) whose fp32 keeps the estimated fp16 cosine on
    ``samples`` (whose fp32 outputs are ``references``) within the budget for ``cosine_min``, as
    ``judge`` scores outputs (default: cosine over every float output); and the estimate's spread."""
    judge = judge or Judge(cosine_min)
    target = 1.0 - (1.0 - cosine_min) * BUDGET_SHARE
    weights = RoundedWeights(program)

    def cosine_with(kept: set[str], which=range(len(samples)), rounding=None) -> float:
        with weights.applied(kept):
            return worst_cosine([references[i] for i in which],
                                [emulated_fp16(program, samples[i], kept, rounding) for i in which], judge)

    per_sample = [cosine_with(keep, [i]) for i in range(len(samples))]
    start = min(per_sample, default=1.0)
    result = PrecisionResult(cosine_min=cosine_min, fp16_cosine=start, kept_cosine=start,
                             judged_as="detections" if judge.detections else "cosine")
    if not samples:
        return result
    worst = int(np.argmin(per_sample))
    if start < target:
        _search(result, program, keep, per_sample, target, cosine_with)
    # the same estimate under other roundings of the same step: how far one draw can be trusted
    chosen = keep | set(result.kept)
    nearest = per_sample[worst] if not result.kept else cosine_with(chosen, [worst])
    draws = [cosine_with(chosen, [worst], stochastic_rounding(seed)) for seed in range(STOCHASTIC_DRAWS)]
    result.spread = (min(nearest, *draws), max(nearest, *draws))
    return result


def _search(result: PrecisionResult, program, keep: set[str], per_sample: list[float], target: float,
            cosine_with) -> None:
    """Fill ``result.kept`` with the most sensitive runs of ops, as few as meet ``target``."""
    candidates = float_ops(program, keep)
    every = {op.name for op in candidates}
    # ranked on the worst sample: the deficit of rounding one run alone, the rest in fp32
    worst = int(np.argmin(per_sample))
    runs = segments_of(candidates)
    deficits = [1.0 - cosine_with(keep | (every - {op.name for op in run}), [worst]) for run in runs]
    ranked = [runs[i] for i in np.argsort(deficits, kind="stable")[::-1]]

    def kept_by(count: int) -> set[str]:
        return {op.name for run in ranked[:count] for op in run}

    low, high, cosine_at_high = 0, len(ranked), 1.0  # all runs kept: the fp32 program itself
    while high - low > 1:
        middle = (low + high) // 2
        cosine = cosine_with(keep | kept_by(middle))
        if cosine >= target:
            high, cosine_at_high = middle, cosine
        else:
            low = middle
    chosen = kept_by(high)
    result.kept = {op.name: op.op_type for op in candidates if op.name in chosen}
    result.kept_cosine = cosine_at_high
