"""Validation by generation: the artifact and the source each continue the same prompts greedily.

Both sides generate on their own (neither is teacher-forced), so once their tokens differ their
contexts differ and later logits are no longer comparable. Per prompt we therefore report the
cosine between the two sides' logits only up to and including the first divergent step, and the
share of equal tokens over every step. The limits (``validate.thresholds``):

- ``token_agreement_min`` (default 1.0): every prompt's share of equal tokens;
- ``step_cosine_min`` (default: ``cosine_min``, else not enforced): every compared step's cosine.

An fp32 artifact must agree on every token; fp16 and compressed variants lower the limits in
their variant blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from edgebuild.errors import BuildError
from edgebuild.protocols import Generator
from edgebuild.verify.thresholds import _fmt_apart

OUTPUT = "logits"  # the output generation validation measures
DEFAULT_TOKEN_AGREEMENT_MIN = 1.0


class SessionGenerator(Generator):
    """An artifact's ``InferenceSession`` as a :class:`Generator`: each prompt starts from an empty cache."""

    def __init__(self, session):
        self.session = session

    def generate(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        self.session.reset()
        tokens, logits = self.session.generate(list(prompt_ids), new_tokens, return_logits=True)
        return list(tokens), np.asarray(logits)


@dataclass
class PromptComparison:
    """One prompt: both sides' tokens, the per-step logits cosine up to the first divergence."""

    prompt: list[int]
    artifact_tokens: list[int]
    source_tokens: list[int]
    step_cosine: list[float]  # steps 0 .. first_divergence (all steps when none)
    first_divergence: Optional[int]  # the first step whose tokens differ; None: every token agrees
    agreement: float  # share of steps with equal tokens
    nonfinite: int = 0  # NaN/inf values in the artifact's logits
    text: Optional[str] = None  # the prompt as written, for tokenizer prompts

    @property
    def worst_step(self) -> Optional[int]:
        """The compared step with the lowest cosine (NaN counts as lowest)."""
        if not self.step_cosine:
            return None
        return min(range(len(self.step_cosine)), key=lambda i: _ordered(self.step_cosine[i]))

    @property
    def worst_cosine(self) -> float:
        step = self.worst_step
        return math.nan if step is None else self.step_cosine[step]


@dataclass
class GenerationComparison:
    """Every prompt's comparison and the figures over all of them."""

    new_tokens: int
    prompts: list[PromptComparison] = field(default_factory=list)

    @property
    def worst_step_cosine(self) -> float:
        return min((p.worst_cosine for p in self.prompts), key=_ordered, default=math.nan)

    @property
    def mean_agreement(self) -> float:
        return float(np.mean([p.agreement for p in self.prompts])) if self.prompts else math.nan

    @property
    def first_divergence(self) -> Optional[int]:
        """The earliest divergent step over the prompts; None when every prompt agrees throughout."""
        steps = [p.first_divergence for p in self.prompts if p.first_divergence is not None]
        return min(steps) if steps else None


def compare_generation(artifact: Generator, source: Generator, prompts: Sequence[Sequence[int]], new_tokens: int,
                       *, texts: Sequence[str] | None = None,
                       on_done: Callable[[int], None] | None = None) -> GenerationComparison:
    """Let both sides continue every prompt by ``new_tokens`` greedy tokens and compare them step by step
    (``on_done(n)`` after the first ``n`` prompts)."""
    result = GenerationComparison(new_tokens)
    for index, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        ours, our_logits = _generated(artifact, "artifact", prompt, new_tokens)
        theirs, their_logits = _generated(source, "source", prompt, new_tokens)
        divergent = next((step for step in range(new_tokens) if ours[step] != theirs[step]), None)
        compared = new_tokens if divergent is None else divergent + 1
        cosines = [_cosine(our_logits[step], their_logits[step]) for step in range(compared)]
        agreement = sum(a == b for a, b in zip(ours, theirs)) / new_tokens
        result.prompts.append(PromptComparison(
            prompt=prompt, artifact_tokens=ours, source_tokens=theirs, step_cosine=cosines,
            first_divergence=divergent, agreement=agreement,
            nonfinite=int(np.count_nonzero(~np.isfinite(our_logits))),
            text=texts[index] if texts is not None else None))
        if on_done is not None:
            on_done(index + 1)
    return result


def _generated(generator: Generator, side: str, prompt: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
    tokens, logits = generator.generate(list(prompt), new_tokens)
    tokens = [int(t) for t in tokens]
    logits = np.asarray(logits)
    if logits.ndim == 3 and logits.shape[0] == 1:  # [1, steps, V]
        logits = logits[0]
    if len(tokens) != new_tokens or logits.ndim != 2 or logits.shape[0] != new_tokens:
        raise BuildError(f"validate.generation: the {side} generated {len(tokens)} tokens with logits of shape "
                         f"{list(logits.shape)} for a {len(prompt)}-token prompt, expected {new_tokens} tokens "
                         f"and logits [{new_tokens}, vocabulary]",
                         hint="its generator must return only the new tokens and the logits of each step")
    return tokens, logits


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise BuildError(f"validate.generation: the artifact's logits have {a.size} entries per step, the "
                         f"source's {b.size}", hint="both sides must score the same vocabulary")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.nan
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.clip(np.dot(a, b) / (na * nb), -1.0, 1.0))


def _ordered(value: float) -> float:
    """Sort key: NaN below everything (a NaN cosine is the worst)."""
    return -math.inf if math.isnan(value) else value


# -- limits ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GenerationLimits:
    token_agreement_min: Optional[float] = DEFAULT_TOKEN_AGREEMENT_MIN
    step_cosine_min: Optional[float] = None

    def as_thresholds(self) -> dict[str, float]:
        """``{threshold name: limit}`` of the enforced limits (for the report)."""
        return {name: value for name, value in (("token_agreement_min", self.token_agreement_min),
                                                ("step_cosine_min", self.step_cosine_min)) if value is not None}


def generation_limits(thresholds) -> GenerationLimits:
    """The recipe's limits with their defaults: token agreement 1.0; step cosine the recipe's ``cosine_min``."""
    if thresholds is None:
        return GenerationLimits()
    get = (lambda name: thresholds.get(name)) if isinstance(thresholds, dict) else (
        lambda name: getattr(thresholds, name, None))
    agreement = get("token_agreement_min")
    step_cosine = get("step_cosine_min")
    return GenerationLimits(
        token_agreement_min=DEFAULT_TOKEN_AGREEMENT_MIN if agreement is None else agreement,
        step_cosine_min=get("cosine_min") if step_cosine is None else step_cosine)


def check_generation(result: GenerationComparison, limits: GenerationLimits) -> list[dict]:
    """The unmet limits, one per prompt and metric, each naming the prompt and the step."""
    failures = []
    for index, prompt in enumerate(result.prompts):
        where = f"prompt {index}" + (f" ({_quoted(prompt.text)})" if prompt.text else "")
        if prompt.nonfinite:
            failures.append(_failure("nonfinite", prompt.nonfinite, None, index, None,
                                     f"{OUTPUT}: {where}: the artifact's logits have {prompt.nonfinite} NaN/inf values"))
        limit = limits.token_agreement_min
        if limit is not None and prompt.agreement < limit:
            step = prompt.first_divergence
            shown, bound = _fmt_apart(prompt.agreement, limit)
            failures.append(_failure(
                "token_agreement", prompt.agreement, limit, index, step,
                f"{OUTPUT}: {where}: token_agreement {shown} < token_agreement_min {bound} "
                f"(first divergence at step {step}: artifact {prompt.artifact_tokens[step]}, "
                f"source {prompt.source_tokens[step]})"))
        limit = limits.step_cosine_min
        if limit is not None:
            below = [s for s, c in enumerate(prompt.step_cosine) if math.isnan(c) or c < limit]
            if below:
                worst, step = prompt.worst_cosine, prompt.worst_step
                shown, bound = _fmt_apart(worst, limit)
                failures.append(_failure(
                    "step_cosine", worst, limit, index, step,
                    f"{OUTPUT}: {where}: step_cosine {shown} < step_cosine_min {bound} at step {step} "
                    f"(first below the limit: step {below[0]}; {len(below)} of {len(prompt.step_cosine)} "
                    "compared steps below)"))
    return failures


def _failure(metric: str, value, limit, prompt: int, step: Optional[int], message: str) -> dict:
    return {"output": OUTPUT, "metric": metric, "value": float(value), "limit": limit, "statistic": "worst",
            "message": message, "prompt": prompt, "step": step}


def _quoted(text: str, length: int = 40) -> str:
    return repr(text if len(text) <= length else text[:length - 1] + "…")


# -- the report's record ---------------------------------------------------------------------

def generation_record(result: GenerationComparison, limits: GenerationLimits, failures: list[dict]) -> dict:
    """One ``validation.runtimes`` entry: metrics as the page's tables read them, limits, failures, and
    the per-prompt detail (``generation``) that the console line and the step-cosine plot read."""
    cosines = [c for p in result.prompts for c in p.step_cosine]
    agreements = [p.agreement for p in result.prompts]
    metrics = {OUTPUT: {"step_cosine": _statistics(cosines), "token_agreement": _statistics(agreements)}}
    nonfinite = sum(p.nonfinite for p in result.prompts)
    if nonfinite:
        metrics[OUTPUT]["nonfinite"] = {"max": float(nonfinite)}
    record = {
        "metrics": metrics,
        "failures": failures,
        "limits": {OUTPUT: limits.as_thresholds()},
        "aggregation": {OUTPUT: {"step_cosine": "worst", "token_agreement": "worst"}},
        "generation": {
            "new_tokens": result.new_tokens,
            "worst_step_cosine": result.worst_step_cosine,
            "mean_agreement": result.mean_agreement,
            "first_divergence": result.first_divergence,
            "prompts": [{
                "prompt": p.prompt, **({"text": p.text} if p.text is not None else {}),
                "artifact_tokens": p.artifact_tokens, "source_tokens": p.source_tokens,
                "step_cosine": p.step_cosine, "first_divergence": p.first_divergence, "agreement": p.agreement,
            } for p in result.prompts],
        },
    }
    return record


def _statistics(values: list[float]) -> dict[str, float]:
    if not values:
        return {"min": math.nan, "avg": math.nan, "max": math.nan}
    array = np.asarray(values, dtype=np.float64)
    if np.isnan(array).any():
        return {"min": math.nan, "avg": math.nan, "max": float(np.nanmax(array)) if (~np.isnan(array)).any() else math.nan}
    return {"min": float(array.min()), "avg": float(array.mean()), "max": float(array.max())}


# -- prompts ---------------------------------------------------------------------------------

def prompt_ids(generation, base_dir: Path) -> tuple[list[list[int]], Optional[list[str]]]:
    """``validate.generation.prompts`` as token id lists (and the texts, for tokenizer prompts)."""
    prompts = generation.prompts
    if isinstance(prompts, list):
        return [list(p) for p in prompts], None
    tokenizer = load_tokenizer(Path(base_dir) / prompts.tokenizer, prompts.tokenizer)
    ids = [tokenizer.encode(text, add_special_tokens=prompts.add_special_tokens).ids for text in prompts.texts]
    for text, one in zip(prompts.texts, ids):
        if not one:
            raise BuildError(f"validate.generation.prompts.texts: {_quoted(text)} encodes to no tokens with "
                             f"{prompts.tokenizer}", hint="give a text the tokenizer turns into at least one token")
    return ids, list(prompts.texts)


def load_tokenizer(path: Path, written: str):
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json``; the library is optional."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise BuildError("validate.generation.prompts.tokenizer: reading a tokenizer.json needs the tokenizers "
                         "library", hint="pip install tokenizers, or give the prompts as token ids") from None
    if not path.is_file():
        raise BuildError(f"validate.generation.prompts.tokenizer: no such file ({written!r}, relative to the recipe)",
                         hint="ship the model's tokenizer.json beside the recipe, or give the prompts as token ids")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises its own exception types for malformed files
        raise BuildError(f"validate.generation.prompts.tokenizer: {written!r} is not a tokenizer.json the "
                         f"tokenizers library reads ({exc})",
                         hint="save it with tokenizers' Tokenizer.save or transformers' save_pretrained") from None
