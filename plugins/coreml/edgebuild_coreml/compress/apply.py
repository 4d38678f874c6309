"""Apply a recipe's compression section to an .mlpackage with coremltools.optimize.coreml.

The section becomes one OptimizationConfig per coremltools pass (prune, then linear, then
palettise): the global weights go to ``global_config``, type-only overrides to
``op_type_configs`` and name-regex overrides to ``op_name_configs`` (regexes resolved against
the program's op names). An op whose configuration belongs to another pass is set to None so
the global one does not reach it. Precedence is coremltools': op name, then op type, then global.

Scalar k-means palettisation (``algorithm: kmeans``) does not go through coremltools' pass:
``fast_palettize`` rewrites the program directly and ``serialize`` writes it once. The model
moves between passes as a :class:`_Working` copy that is an MLModel, a MIL program, or both.
When that k-means palettisation is the whole section, ``spec_palettize`` edits the package's
protobuf and weight file instead and no MIL program is built at all.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np

from edgebuild.errors import BuildError

from .activations import quantize_activations
from .fast_palettize import fast_palettize_program, uses_fast_kmeans
from .config import (
    CompressionSection,
    LinearWeights,
    PalettizeWeights,
    PruneWeights,
    validate_compression,
)
from .gating import check_deployment_target
from .lut import KmeansLutFunction, channel_groups
from .noop import check_something_changed
from .program import iter_ops, is_weight_op, load_program, weight_uses
from .serialize import program_to_model, save_program
from .spec_palettize import NotEditable, palettize_package

_PASS_ORDER = ("prune", "linear", "palettize")


def compress_mlpackage(
    src: Path,
    dst: Path,
    section: CompressionSection | dict,
    *,
    target: str,
    calibration: list[dict[str, np.ndarray]] | None = None,
) -> dict:
    """Compress ``src`` into ``dst`` (written atomically) and report every weight's sizes."""
    if not isinstance(section, CompressionSection):
        section = validate_compression(section)
    check_deployment_target(section, target)
    src, dst = Path(src), Path(dst)
    if _is_plain_kmeans_palettize(section):
        try:
            return _checked_report(section, *_palettize_spec(src, dst, section))
        except NotEditable:
            pass  # an unusual package: the MIL program path below handles it

    working = _Working(ct.models.MLModel(str(src), skip_model_load=True))
    before = weight_uses(working.program)
    if section.activations is not None:
        working.model, _ = quantize_activations(working.model, calibration, source=src)
    for stage in plan_weight_passes(section, working.program):
        stage.apply(working)
    after = weight_uses(working.program)
    working.save(dst)
    return _checked_report(section, before, after)


def _checked_report(section: CompressionSection, before: dict, after: dict) -> dict:
    """The report, with a warning naming targeted weights left as they were (none changed: an error)."""
    report = _report(before, after)
    warnings = check_something_changed(section, before, after)
    if warnings:
        report["warnings"] = warnings
    return report


def _is_plain_kmeans_palettize(section: CompressionSection) -> bool:
    """Only our scalar k-means palettisation, one config for every weight, nothing combined."""
    weights = section.weights
    return (
        isinstance(weights, PalettizeWeights)
        and weights.algorithm == "kmeans"
        and weights.cluster_dim == 1
        and not weights.per_channel_scale
        and not section.overrides
        and section.activations is None
        and section.auto is None
    )


def _palettize_spec(src: Path, dst: Path, section: CompressionSection) -> tuple[dict, dict]:
    weights = section.weights
    return palettize_package(
        src,
        dst,
        nbits=weights.nbits,
        group_size=weights.group_size if weights.granularity == "per_grouped_channel" else 0,
        weight_threshold=max(section.weight_threshold - 1, 0),  # as plan_weight_passes
    )


class _Working:
    """The model being compressed: converted between MLModel and MIL program only when needed."""

    def __init__(self, model: ct.models.MLModel):
        self._model = model
        self._program = None
        self._program_changed = False

    @property
    def program(self):
        if self._program is None:
            self._program = load_program(self._model)
        return self._program

    def program_changed(self) -> None:
        """The program was rewritten in place; the MLModel no longer matches it."""
        self._program_changed = True

    @property
    def model(self) -> ct.models.MLModel:
        if self._program_changed:
            self._model = program_to_model(self._program, like=self._model)
            self._program_changed = False
        return self._model

    @model.setter
    def model(self, model: ct.models.MLModel) -> None:
        self._model, self._program, self._program_changed = model, None, False

    def save(self, dst: Path) -> None:
        if self._program_changed:
            save_program(self._program, self._model, dst)
        else:
            _save_atomically(self._model, dst)


@dataclass
class WeightPass:
    """One coremltools compression pass with its configuration."""

    kind: str  # "prune" | "linear" | "palettize"
    config: cto.OptimizationConfig
    joint: bool = False
    lut_functions: list[KmeansLutFunction] = field(default_factory=list)

    def apply(self, working: _Working) -> None:
        """Run the pass on ``working``: our own palettiser where it applies, else coremltools'."""
        if self.kind == "palettize" and not self.joint:
            configs = _all_op_configs(self.config)
            if any(uses_fast_kmeans(c) for c in configs):
                fast_palettize_program(working.program, self.config)
                working.program_changed()
                rest = _without_fast_kmeans(self.config)
                if not _all_op_configs(rest):
                    return
                self.config = rest
                self.lut_functions = [
                    c.lut_function
                    for c in _all_op_configs(rest)
                    if isinstance(getattr(c, "lut_function", None), KmeansLutFunction)
                ]
        working.model = self.run(working.model)

    def run(self, model: ct.models.MLModel) -> ct.models.MLModel:
        if self.lut_functions:
            prepare_lut_functions(self.config, load_program(model), self.lut_functions)
        run_pass = {
            "prune": cto.prune_weights,
            "linear": cto.linear_quantize_weights,
            "palettize": cto.palettize_weights,
        }[self.kind]
        try:
            return run_pass(model, self.config, joint_compression=self.joint)
        except ValueError as error:  # coremltools reports unsupported combinations this way
            raise BuildError(f"{self.kind} compression failed: {error}") from error


def plan_weight_passes(section: CompressionSection, program) -> list[WeightPass]:
    """The coremltools passes the section needs, in the order they must run."""
    selectors = _resolve_selectors(section, program)
    threshold = max(section.weight_threshold - 1, 0)  # coremltools compresses sizes > threshold
    passes = []
    for kind in _PASS_ORDER:
        configs = {key: _pass_config(kind, weights, threshold) for key, weights in selectors.items()}
        if all(config is None for config in configs.values()):
            continue
        global_config = configs.pop(("global", None), None)
        config = cto.OptimizationConfig(
            global_config=global_config,
            op_type_configs={name: cfg for (scope, name), cfg in configs.items() if scope == "type"},
            op_name_configs={name: cfg for (scope, name), cfg in configs.items() if scope == "name"},
        )
        joint = kind != "prune" and any(
            isinstance(w, PruneWeights) and w.then is not None for w in selectors.values()
        )
        luts = [
            c.lut_function
            for c in _all_op_configs(config)
            if isinstance(getattr(c, "lut_function", None), KmeansLutFunction)
        ]
        passes.append(WeightPass(kind, config, joint, luts))
    return passes


def _resolve_selectors(section: CompressionSection, program) -> dict[tuple[str, str | None], object]:
    """(scope, key) -> weights config; scope is global, type (op type) or name (op name)."""
    selectors: dict[tuple[str, str | None], object] = {("global", None): section.weights}
    compute_ops = [op for op in iter_ops(program) if not is_weight_op(op)]
    for override in section.overrides:
        match = override.match
        if match.name is None:
            selectors[("type", match.op_type)] = override.weights
            continue
        pattern = re.compile(match.name)
        for op in compute_ops:
            if pattern.fullmatch(op.name) and match.op_type in (None, op.op_type):
                selectors[("name", op.name)] = override.weights
    return selectors


def _pass_config(kind: str, weights, threshold: int):
    """The coremltools op config for ``weights`` in pass ``kind``, or None if not its pass."""
    if isinstance(weights, PruneWeights):
        if kind == "prune":
            return _pruner_config(weights, threshold)
        weights = weights.then
    if isinstance(weights, LinearWeights) and kind == "linear":
        return _linear_config(weights, threshold)
    if isinstance(weights, PalettizeWeights) and kind == "palettize":
        return _palettizer_config(weights, threshold)
    return None


def _pruner_config(weights: PruneWeights, threshold: int):
    if weights.method == "threshold":
        return cto.OpThresholdPrunerConfig(
            threshold=weights.threshold, minimum_sparsity_percentile=0.0, weight_threshold=threshold
        )
    if weights.method == "magnitude":
        return cto.OpMagnitudePrunerConfig(
            target_sparsity=weights.target_sparsity, weight_threshold=threshold
        )
    return cto.OpMagnitudePrunerConfig(n_m_ratio=tuple(weights.n_m), weight_threshold=threshold)


def _linear_config(weights: LinearWeights, threshold: int):
    extra = {"block_size": weights.block_size} if weights.granularity == "per_block" else {}
    return cto.OpLinearQuantizerConfig(
        mode="linear_symmetric" if weights.symmetric else "linear",
        dtype=weights.dtype,
        granularity=weights.granularity,
        weight_threshold=threshold,
        **extra,
    )


def _palettizer_config(weights: PalettizeWeights, threshold: int):
    common = dict(
        granularity=weights.granularity,
        group_size=weights.group_size,
        cluster_dim=weights.cluster_dim,
        enable_per_channel_scale=weights.per_channel_scale,
        weight_threshold=threshold,
    )
    # Our clustering is scalar; vector palettisation (cluster_dim > 1) stays with coremltools.
    # Without joint compression or per-channel scales the fast pass takes these configs;
    # otherwise coremltools' pass calls the lut function per group.
    if weights.algorithm == "kmeans" and weights.cluster_dim == 1:
        return cto.OpPalettizerConfig(
            mode="custom", lut_function=KmeansLutFunction(weights.nbits), **common
        )
    mode = "kmeans" if weights.algorithm.startswith("kmeans") else weights.algorithm
    return cto.OpPalettizerConfig(mode=mode, nbits=weights.nbits, **common)


def _all_op_configs(config: cto.OptimizationConfig) -> list:
    configs = [
        config.global_config,
        *config.op_type_configs.values(),
        *config.op_name_configs.values(),
    ]
    return [c for c in configs if c is not None]


def _without_fast_kmeans(config: cto.OptimizationConfig) -> cto.OptimizationConfig:
    """``config`` with our k-means entries set to None (those weights are already done)."""

    def keep(op_config):
        return None if uses_fast_kmeans(op_config) else op_config

    return cto.OptimizationConfig(
        global_config=keep(config.global_config),
        op_type_configs={name: keep(c) for name, c in config.op_type_configs.items()},
        op_name_configs={name: keep(c) for name, c in config.op_name_configs.items()},
    )


def prepare_lut_functions(config: cto.OptimizationConfig, program, lut_functions) -> None:
    """Cluster every weight our lut functions will be asked for, in parallel, ahead of the pass.

    This mirrors how the pass picks a weight's configuration and channel groups; anything it
    misses is simply clustered when the pass asks for it.
    """
    from coremltools.optimize._utils import infer_block_sizes

    wanted = {id(fn): [] for fn in lut_functions}
    for op in iter_ops(program):
        if op.op_type != "const" or not op.outputs[0].child_ops:
            continue
        try:
            op_config = config._get_const_op_config(op)
        except (ValueError, TypeError):
            continue
        lut_function = getattr(op_config, "lut_function", None)
        value = op.outputs[0].val
        if id(lut_function) not in wanted or not isinstance(value, np.ndarray):
            continue
        if value.ndim <= 1 or value.size <= op_config.weight_threshold:
            continue
        block_sizes, axis = infer_block_sizes(op, op_config, value, return_channel_axis=True)
        if block_sizes is None:
            continue
        axis = 0 if axis is None else axis
        group_size = block_sizes[axis] if any(block_sizes) else 0
        groups = channel_groups(value, axis, group_size)
        if groups is not None:
            wanted[id(lut_function)].append(groups)
    for fn in lut_functions:
        fn.prepare(wanted[id(fn)])


def _save_atomically(model: ct.models.MLModel, dst: Path) -> None:
    """Write next to ``dst`` and rename into place, so readers never see a partial package."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        written = staging / dst.name
        model.save(str(written))
        if dst.exists():
            retired = staging / "previous"
            os.replace(dst, retired)
        os.replace(written, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _report(before: dict, after: dict) -> dict:
    """Per weight: name, op type, shape, bytes before and after, and how it was compressed."""
    weights = []
    for name, original in before.items():
        compressed = after.get(name, original)
        weights.append(
            {
                "name": name,
                "op_type": original.op_type,
                "shape": list(original.shape),
                "bytes_before": original.bytes,
                "bytes_after": compressed.bytes,
                "mode": compressed.mode,
            }
        )
    return {
        "weights": weights,
        "bytes_before": sum(w["bytes_before"] for w in weights),
        "bytes_after": sum(w["bytes_after"] for w in weights),
    }
