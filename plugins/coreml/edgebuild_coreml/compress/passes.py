"""The weight passes a compression section needs: prune, then linear, then palettise.

Each pass carries the typed weights config every op gets in it (:mod:`.selection`). Scalar
k-means palettisation runs as our own pass over the MIL program (:mod:`.fast_palettize`);
everything else becomes one coremltools ``OptimizationConfig`` per pass, built only to hand
to coremltools.optimize.coreml: the global weights go to ``global_config``, type overrides
to ``op_type_configs`` and name overrides to ``op_name_configs``. An op whose configuration
belongs to another pass is set to None so the global one does not reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np

from edgebuild.plugin import BuildError

from .config import LinearWeights, PalettizeWeights, PruneWeights
from .fast_palettize import fast_palettize_program, handles
from .lut import KmeansLutFunction, channel_groups
from .program import iter_ops, load_program
from .selection import WeightSelection, select_weights
from .working import WorkingModel

PASS_ORDER = ("prune", "linear", "palettize")


def pass_weights(kind: str, weights):
    """The part of ``weights`` that pass ``kind`` applies (a prune's ``then`` for the later
    passes), or None when the pass leaves those weights alone."""
    if isinstance(weights, PruneWeights):
        if kind == "prune":
            return weights
        weights = weights.then
    if isinstance(weights, LinearWeights) and kind == "linear":
        return weights
    if isinstance(weights, PalettizeWeights) and kind == "palettize":
        return weights
    return None


@dataclass
class WeightPass:
    """One compression pass and the weights config each op gets in it."""

    kind: str  # "prune" | "linear" | "palettize"
    selection: WeightSelection
    weight_threshold: int  # coremltools' sense: weights of more elements than this are compressed
    joint: bool = False

    def apply(self, working: WorkingModel) -> None:
        """Run the pass on ``working``: our own palettiser where it applies, else coremltools'."""
        rest = self
        if self.kind == "palettize" and not self.joint and any(handles(w) for w in self.selection.entries()):
            fast_palettize_program(working.program, self.selection, self.weight_threshold)
            working.program_changed()
            rest = replace(self, selection=self.selection.map(lambda weights: None if handles(weights) else weights))
            if rest.selection.is_empty():
                return
        working.model = rest.run(working.model)

    def run(self, model: ct.models.MLModel) -> ct.models.MLModel:
        """coremltools' pass over ``model``, with our k-means as the lut function where asked for."""
        config, lut_functions = coremltools_config(self.kind, self.selection, self.weight_threshold)
        if lut_functions:
            prepare_lut_functions(config, load_program(model), lut_functions)
        run_pass = {
            "prune": cto.prune_weights,
            "linear": cto.linear_quantize_weights,
            "palettize": cto.palettize_weights,
        }[self.kind]
        try:
            return run_pass(model, config, joint_compression=self.joint)
        except ValueError as error:  # coremltools reports unsupported combinations this way
            raise BuildError(f"{self.kind} compression failed: {error}") from error


def plan_weight_passes(section, program) -> list[WeightPass]:
    """The passes the section (a ``config.CompressionSection``) needs, in the order they must run."""
    selection = select_weights(section, program)
    threshold = max(section.weight_threshold - 1, 0)  # coremltools compresses sizes > threshold
    joint = any(isinstance(w, PruneWeights) and w.then is not None for w in selection.entries())
    passes = []
    for kind in PASS_ORDER:
        part = selection.map(lambda weights: pass_weights(kind, weights))
        if not part.is_empty():
            passes.append(WeightPass(kind, part, threshold, joint=joint and kind != "prune"))
    return passes


def coremltools_config(kind: str, selection: WeightSelection, threshold: int):
    """The ``OptimizationConfig`` of pass ``kind`` and the k-means lut functions in it."""
    lut_functions: list[KmeansLutFunction] = []

    def op_config(weights):
        if weights is None:
            return None
        config = _op_config(kind, weights, threshold)
        if isinstance(getattr(config, "lut_function", None), KmeansLutFunction):
            lut_functions.append(config.lut_function)
        return config

    config = cto.OptimizationConfig(
        global_config=op_config(selection.global_weights),
        op_type_configs={name: op_config(w) for name, w in selection.by_type.items()},
        op_name_configs={name: op_config(w) for name, w in selection.by_name.items()},
    )
    return config, lut_functions


def _op_config(kind: str, weights, threshold: int):
    if kind == "prune":
        return _pruner_config(weights, threshold)
    if kind == "linear":
        return _linear_config(weights, threshold)
    return _palettizer_config(weights, threshold)


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
    # Where the fast pass does not apply (joint compression, per-channel scales), coremltools'
    # pass calls our lut function per group.
    if weights.algorithm == "kmeans" and weights.cluster_dim == 1:
        return cto.OpPalettizerConfig(
            mode="custom", lut_function=KmeansLutFunction(weights.nbits), **common
        )
    mode = "kmeans" if weights.algorithm.startswith("kmeans") else weights.algorithm
    return cto.OpPalettizerConfig(mode=mode, nbits=weights.nbits, **common)


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
