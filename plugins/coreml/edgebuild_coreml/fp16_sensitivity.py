"""fp16 precision search: the fewest ops to keep in fp32 so the outputs stay within the recipe's cosine limit.

Some models fit the fp16 range but not its precision: each op's fp16 rounding is tiny, but a deep,
badly conditioned net (squeeze-and-excitation gates reading large logits, say) amplifies what the
early layers round off, and the outputs drift below ``validate.thresholds.cosine_min``. The guard
finds that on its calibration samples, before the fp16 cast pass runs:

- the fp32 program runs with its inputs, its weights and every float op's outputs rounded to
  fp16 as it computes (the interpreter's ``observer`` replaces them), except the ops kept in fp32
  and the weights only they read; the outputs' cosine against the plain fp32 run estimates the
  artifact's. The weights count as much as the activations: a convolution with a batch norm
  folded in, whose bias cancels most of its product, loses to both alike. An op that only moves
  values already on fp16's grid (``GRID_PRESERVING``: reshape, gather, concat, relu...) is not
  rounded again: the same values, without a detector's RoI gathers' gigabyte of rounding. The
  convolutions are onnxruntime's (``ort_kernels``), as validation's in the build's process are;
- when that estimate misses the budget, the ops are cut, in program order, into SEGMENTS
  contiguous runs; each run's sensitivity is the cosine deficit of rounding it alone;
- the most sensitive runs are kept in fp32, as few as meet the budget on every sample (a
  bisection over how many). Contiguous runs make islands with casts only at their ends.

A detector's outputs (``validate.detections``) are judged as validation judges them (``Judge``):
boxes matched by IoU, the cosine over the matched pairs, and each box limit's shortfall put on
the cosine's scale (a box_match at its limit counts as a cosine at cosine_min). A plain cosine
over boxes after NMS measures their order, which a last bit changes, and kept everything fp32.

The estimate is one draw of a chaotic quantity for a badly conditioned net: the artifact's
kernels round and sum in their own order (the interpreter's numpy and torch kernels differ, a
Mac's Core ML differs again), and a net that amplifies last-bit differences lands anywhere in a
range. So the search judges every candidate by the LOWER END of that range: the worst sample
rounded to nearest and STOCHASTIC_DRAWS more times stochastically (an unbiased rounding with the
same step), the lowest of those. Runs are ranked by the same measure, so a run whose deficit
shows only under another rounding (an SE gate on large logits, say) is found too. The islands
are capped at MAX_KEPT_SHARE of the float ops: past that, fp16 buys little, and the estimate
itself grows optimistic (each island's fp16 readers see its fp32 values), so a net that needs
more is named instead (``ill_conditioned``) with the nearest-rounding choice kept. Fresh
draws (other seeds than the search used) then measure the chosen islands' range: where its lower
end misses the recipe's cosine_min, rounding alone decides whether the artifact passes, and the
result says so instead of trusting one estimate.

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

STOCHASTIC_DRAWS = 2  # stochastic-rounding runs of the worst sample behind each lower end (and the final range)
MAX_KEPT_SHARE = 0.5  # of the float ops, the most the search keeps in fp32 for the lower end to meet its budget
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
    # the lower end the most islands the search may keep (MAX_KEPT_SHARE) reach, when fewer do not meet
    # the budget; None when the chosen islands meet it
    capped_cosine: float | None = None
    cap: int = 0  # that most: how many ops

    @property
    def ill_conditioned(self) -> bool:
        """No island set within the cap holds the lower end, or rounding alone, redrawn, takes the outputs
        below the recipe's limit with the islands kept: no estimate bounds the artifact."""
        return self.capped_cosine is not None or (self.spread is not None and self.spread[0] < self.cosine_min)

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
        if self.capped_cosine is not None:
            found["capped_islands"] = {"max_ops": self.cap, "estimated_lower_cosine": round(self.capped_cosine, 7)}
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
    from edgebuild_coreml.interpreter.half_rounding import stochastic_round_to_half

    rng = np.random.default_rng(seed)
    return lambda value: stochastic_round_to_half(value, rng)


class RoundedWeights:
    """The fp32 constants of ``program`` with their fp16-rounded values, swapped in for a run."""

    def __init__(self, program):
        from edgebuild_coreml.interpreter.half_rounding import round_to_half

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
    from edgebuild_coreml.interpreter.half_rounding import round_to_half

    def rounded(value, rounding=round_to_half):
        return rounding(value) if isinstance(value, np.ndarray) and value.dtype == np.float32 else value

    function = program.functions["main"]
    returned = {var.name for var in function.outputs}

    def read_in_fp32(op) -> bool:
        # a kept op only fp16 ops read is cast down by each of them: its value counts as fp16
        return op.name in keep and any(var.name in returned or any(reader.name in keep for reader in var.child_ops)
                                       for var in op.outputs)

    inputs = function.inputs
    # an input only fp32 ops read is not cast (the cast pass casts it for fp16 readers)
    cast = {name for name, var in inputs.items() if not all(reader.name in keep for reader in var.child_ops)}
    on_grid = {id(inputs[name]) for name in cast}  # values holding fp16 values only (the vars' ids)

    def observe(op, outputs):
        if read_in_fp32(op):
            return None
        on_grid.update(map(id, op.outputs))
        if op.op_type in GRID_PRESERVING and all(id(var) in on_grid for var in _float_inputs(op)):
            return None  # its values are its inputs' fp16 values: rounding them again changes nothing
        return [rounded(value, rounding or round_to_half) for value in outputs]

    return run_program(program, {name: rounded(np.asarray(value)) if name in cast else value
                                 for name, value in sample.items()}, observer=observe)


#: ops each of whose float outputs is one of its float inputs' elements (or zero): on fp16's grid
#: when those are, so either rounding leaves them as they are (a constant input counts as off it)
GRID_PRESERVING = frozenset({
    "reshape", "reshape_like", "transpose", "squeeze", "expand_dims", "flatten2d", "identity",
    "slice_by_index", "slice_by_size", "gather", "gather_nd", "gather_along_axis", "concat", "stack",
    "split", "tile", "reverse", "reverse_sequence", "depth_to_space", "space_to_depth", "pixel_shuffle",
    "pixel_unshuffle", "sliding_windows", "upsample_nearest_neighbor", "band_part", "select", "relu",
    "maximum", "minimum", "max_pool", "reduce_max", "reduce_min", "topk",
})


def _float_inputs(op):
    """The float vars ``op`` reads (list-valued inputs flattened)."""
    from coremltools.converters.mil.mil import types

    from edgebuild_coreml.interpreter.plan import input_vars

    return (var for var in input_vars(op) if var.dtype in (types.fp16, types.fp32))


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
    """The fewest ops (besides ``keep``, already fp32) whose fp32 keeps the lower end of the estimated
    fp16 cosine on ``samples`` (whose fp32 outputs are ``references``) within the budget for
    ``cosine_min``, as ``judge`` scores outputs (default: cosine over every float output); and the
    range fresh roundings give with them."""
    judge = judge or Judge(cosine_min)
    estimate = _Estimate(program, samples, references, judge)
    per_sample = estimate.per_sample(keep)
    estimate.worst = int(np.argmin(per_sample)) if per_sample else 0
    start = min(per_sample, default=1.0)
    result = PrecisionResult(cosine_min=cosine_min, fp16_cosine=start, kept_cosine=start,
                             judged_as="detections" if judge.detections else "cosine")
    if not samples:
        return result
    target = 1.0 - (1.0 - cosine_min) * BUDGET_SHARE
    search_draws = range(STOCHASTIC_DRAWS)
    if estimate.lower_end(keep, search_draws) < target:
        _search(result, program, keep, target, estimate, search_draws)
    # fresh draws on the chosen islands: the search's own were what it chose them to pass
    chosen = keep | set(result.kept)
    nearest = estimate.nearest(chosen, [estimate.worst])
    draws = [estimate.drawn(chosen, seed) for seed in range(STOCHASTIC_DRAWS, 2 * STOCHASTIC_DRAWS)]
    result.spread = (min(nearest, *draws), max(nearest, *draws))
    return result


class _Estimate:
    """The emulated fp16 run's score for a set of ops kept in fp32: rounded to nearest on every sample,
    or stochastically on the worst (the sample the nearest rounding of ``keep`` alone scores lowest)."""

    def __init__(self, program, samples, references, judge: Judge):
        self.program, self.samples, self.references, self.judge = program, samples, references, judge
        self.weights = RoundedWeights(program)
        self.worst = 0
        self._scores: dict[tuple, float] = {}  # (kept, sample, seed or None) -> score: each run once

    def _score(self, kept: set[str], which, seed: int | None = None) -> float:
        """The lowest score over the samples ``which`` (a judge scores each sample alone)."""
        frozen = frozenset(kept)
        worst = 1.0
        for i in which:
            key = (frozen, i, seed)
            if key not in self._scores:
                rounding = None if seed is None else stochastic_rounding(seed)
                with self.weights.applied(kept):
                    outputs = emulated_fp16(self.program, self.samples[i], kept, rounding)
                self._scores[key] = worst_cosine([self.references[i]], [outputs], self.judge)
            worst = min(worst, self._scores[key])
        return worst

    def per_sample(self, kept: set[str]) -> list[float]:
        return [self._score(kept, [i]) for i in range(len(self.samples))]

    def nearest(self, kept: set[str], which=None) -> float:
        return self._score(kept, range(len(self.samples)) if which is None else which)

    def drawn(self, kept: set[str], seed: int) -> float:
        return self._score(kept, [self.worst], seed)

    def lower_end(self, kept: set[str], seeds, which_nearest=None) -> float:
        """The lowest of the nearest rounding (every sample, or ``which_nearest``) and the draws ``seeds``."""
        nearest = self.nearest(kept, which_nearest)
        return min(nearest, *(self.drawn(kept, seed) for seed in seeds))


def _search(result: PrecisionResult, program, keep: set[str], target: float, estimate: _Estimate, seeds) -> None:
    """Fill ``result.kept`` with the most sensitive runs of ops, as few as bring the lower end to ``target``
    within MAX_KEPT_SHARE of the ops; past that, as few as bring the nearest rounding there."""
    candidates = float_ops(program, keep)
    every = {op.name for op in candidates}
    runs = segments_of(candidates)
    # ranked on the worst sample by the lower end of rounding one run alone, the rest in fp32
    worst = [estimate.worst]
    deficits = [1.0 - estimate.lower_end(keep | (every - {op.name for op in run}), seeds, worst) for run in runs]
    ranked = [runs[i] for i in np.argsort(deficits, kind="stable")[::-1]]

    def kept_by(count: int) -> set[str]:
        return {op.name for run in ranked[:count] for op in run}

    sizes = np.cumsum([len(run) for run in ranked])
    cap = int(np.searchsorted(sizes, MAX_KEPT_SHARE * len(candidates), side="right"))  # runs within the share
    count, at_cap = _fewest(lambda n: estimate.lower_end(keep | kept_by(n), seeds), 0, cap, target)
    if count is None:  # no island set within the cap holds the lower end: say so, keep what nearest needs
        result.cap, result.capped_cosine = (int(sizes[cap - 1]) if cap else 0), at_cap
        count, _ = _fewest(lambda n: estimate.nearest(keep | kept_by(n)), 0, len(ranked), target)
        count = len(ranked) if count is None else count  # None: only the fp32 program itself meets it
    chosen = kept_by(count)
    result.kept = {op.name: op.op_type for op in candidates if op.name in chosen}
    result.kept_cosine = estimate.nearest(keep | chosen)


def _fewest(score, low: int, high: int, target: float) -> tuple[int | None, float]:
    """The least count in (low, high] whose ``score`` meets ``target`` (a bisection: more kept, higher
    scores), with that score; (None, score at high) when even ``high`` misses it."""
    at_high = score(high)
    if at_high < target:
        return None, at_high
    while high - low > 1:
        middle = (low + high) // 2
        cosine = score(middle)
        if cosine >= target:
            high, at_high = middle, cosine
        else:
            low = middle
    return high, at_high
