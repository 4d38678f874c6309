"""The Core ML backend's compress stage: plain or automatic compression of the lowered package.

The section arrives validated and checked against the deployment target (at load).
``calibration`` may be a list of input dicts or a callable ``(count or None) -> list`` giving
that many (None: as many as the validate section has), so a plain compression that needs no
inputs never generates them and auto mode generates only the samples it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from .config import CompressionSection

Samples = list[dict[str, np.ndarray]]
Calibration = Union[Samples, Callable[[int | None], Samples], None]


def compress_stage(src: Path, dst: Path, section: CompressionSection, *, calibration: Calibration = None,
                   calibration_source: str | None = None) -> dict:
    """Compress ``src`` into ``dst`` as the recipe's ``compression`` section says; the stage's info.
    ``calibration_source`` (where the samples came from) is recorded in auto mode's report."""
    if section.auto is None:
        from .apply import compress_mlpackage
        from .roles import resolve_roles

        section = resolve_roles(section, src)

        samples = _materialise(calibration, None) if section.activations is not None else None
        return compress_mlpackage(src, dst, section, calibration=samples)

    from .auto import auto_compress

    samples = _materialise(calibration, section.auto.samples)
    info = auto_compress(src, dst, section.auto, calibration=samples, weight_threshold=section.weight_threshold)
    if calibration_source is not None and "auto" in info:
        info["auto"]["calibration"] = {"source": calibration_source, "samples": len(samples or [])}
    budget = (f"at most {section.auto.max_size_mb:g} MB" if section.auto.max_size_mb is not None
              else f"{section.auto.metric.replace('_', ' ')} at most {section.auto.max_error:g}")
    info.setdefault("applied", f"modes chosen per layer for {budget}")
    return info


def calibration_inputs(
    onnx_path: Path,
    recipe_inputs: Mapping[str, Any],
    validate_section,
    base_dir: Path,
    lowered_info: Mapping[str, Any] | None,
    samples: int | None = None,
    generate: Mapping[str, Any] | None = None,
) -> Samples:
    """Inputs from the recipe's validate section (uniform [0, 1) without one), keyed by MIL name.

    At most ``samples`` of them (None: the section's count; 4 without a section).

    Fixed-value inputs are folded into the model, so they are not fed. A stateful decoder
    (``generate``, the recipe's section) is fed its prompts as the artifact takes them.
    """
    from edgebuild.plugin.validation import onnx_input_specs
    from edgebuild.plugin.validation import ValidateSection
    from edgebuild.plugin.validation import generate_inputs

    specs = {name: spec for name, spec in onnx_input_specs(onnx_path, dict(recipe_inputs)).items()
             if "value" not in spec}
    renamed = (lowered_info or {}).get("renamed_inputs", {})
    prompts = _generation_prompts(validate_section)
    if prompts and generate is not None:
        return stateful_prompt_samples(prompts[: samples or len(prompts)], generate)
    if prompts and TOKEN_INPUT in specs:
        chosen = prompts[: samples or len(prompts)]
        return [{renamed.get(name, name): value for name, value in sample.items()}
                for sample in prompt_samples(chosen, specs)]
    if validate_section is None:
        validate_section = ValidateSection(samples=samples or 4)
    if samples is not None:
        validate_section = validate_section.model_copy(update={"samples": min(validate_section.samples, samples)})
    return [{renamed.get(name, name): value for name, value in sample.items() if name in specs}
            for sample in generate_inputs(validate_section, specs, base_dir)]


def _materialise(calibration: Calibration, count: int | None) -> Samples | None:
    if callable(calibration):
        return calibration(count)
    return calibration if calibration is None or count is None else calibration[:count]


TOKEN_INPUT = "input_ids"


def _generation_prompts(validate_section) -> list[list[int]]:
    """The token-id prompts of a generative recipe's ``validate.generation`` (none otherwise)."""
    generation = getattr(validate_section, "generation", None)
    prompts = getattr(generation, "prompts", None)
    return [list(p) for p in prompts] if isinstance(prompts, (list, tuple)) else []


def stateful_prompt_samples(prompts: list[list[int]], generate: Mapping[str, Any]) -> Samples:
    """One sample per prompt for a stateful decoder's artifact: ``input_ids`` int32 [1, L], the
    prompt repeated or cut to its longest query length L, at ``position`` 0 (an empty cache)."""
    from edgebuild.plugin.recipe import GenerateSection

    length = GenerateSection.model_validate(dict(generate)).lengths()[0]
    return [{TOKEN_INPUT: np.resize(np.asarray(prompt or [0], dtype=np.int32), length).reshape(1, length),
             "position": np.zeros(1, np.int32)} for prompt in prompts]


def prompt_samples(prompts: list[list[int]], specs: Mapping[str, dict]) -> Samples:
    """One sample per prompt for a decoder with fixed input shapes: ``input_ids`` is the prompt,
    repeated or cut to the input's length (real token statistics, not random floats); an
    ``attention_mask`` is all ones and ``position_ids`` count from 0. Other inputs (a cache)
    start empty: zeros of their shape."""
    samples = []
    for prompt in prompts:
        length = specs[TOKEN_INPUT]["shape"][-1]
        ids = np.resize(np.asarray(prompt or [0], dtype=np.int64), length)
        sample = {}
        for name, spec in specs.items():
            shape, dtype = spec["shape"], np.dtype(spec["dtype"])
            if name == TOKEN_INPUT:
                value = ids.reshape(shape)
            elif name == "attention_mask":
                value = np.ones(shape)
            elif name == "position_ids":
                value = np.broadcast_to(np.arange(shape[-1]), shape)
            else:
                value = np.zeros(shape)
            sample[name] = np.ascontiguousarray(value, dtype=dtype)
        samples.append(sample)
    return samples
