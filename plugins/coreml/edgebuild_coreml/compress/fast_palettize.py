"""Palettise a MIL program's weights with the fast 1-D k-means, as one pass over the program.

coremltools' palettiser clusters one weight (or one channel group) at a time and rebuilds the
program around each; most of its time goes to that bookkeeping. This pass instead

1. picks the ``const`` ops whose weights config (a typed :class:`~.config.PalettizeWeights`,
   looked up as coremltools would, see :mod:`.selection`) asks for our scalar k-means, with the
   eligibility and channel-axis rules of coremltools' pass so both compress the same weights
   the same way;
2. clusters all of them at once: float16 weights with one table each as rows of one matrix
   of weighted distinct values, the rest largest first on a thread pool (numpy's sorts and
   large element-wise kernels release the GIL, so both cores work);
3. replaces each with a ``constexpr_lut_to_dense`` op: the iOS18 form (indices as a uint<n>
   tensor shaped like the weight, one table per channel group) where the program's opset has
   it, otherwise the iOS16 form (bit-packed indices, one table, explicit shape).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.block import is_current_opset_version_compatible_with
from coremltools.converters.mil._deployment_compatibility import AvailableTarget
from coremltools.optimize._utils import select_input_output_channel_axis

from edgebuild.plugin import BuildError, cpu_threads, report_progress

from .config import PalettizeWeights
from .kmeans1d import palettize_fp16_tensors, palettize_groups
from .packing import pack_indices, pack_looked_up
from .program import iter_ops
from .selection import WeightSelection

_FLOAT_WEIGHTS = (np.float16, np.float32)


@dataclass
class PaletteJob:
    """One weight to palettise: its const op, value, bits and channel grouping."""

    op: object
    value: np.ndarray
    nbits: int
    channel_axis: int
    group_size: int  # 0: one table for the whole tensor
    lut: np.ndarray | None = None  # [groups, 2^nbits] in the weight's dtype
    labels: np.ndarray | None = None  # uint8, shaped like value
    packed: np.ndarray | None = None  # or the labels bit-packed (flat uint8, see ``packing``)


def fast_palettize_program(program, selection: WeightSelection, weight_threshold: int, *,
                           workers: int | None = None) -> list[str]:
    """Palettise in place every weight ``selection`` assigns to our k-means (weights of more than
    ``weight_threshold`` elements); returns their names."""
    jobs = find_jobs(program, selection, weight_threshold)
    cluster_jobs(jobs, workers=workers)
    names = [job.op.name for job in jobs]
    # Leaving a block re-checks all its vars, so enter each block once for all its weights.
    by_block: dict[int, list[PaletteJob]] = {}
    for job in jobs:
        by_block.setdefault(id(job.op.enclosing_block), []).append(job)
    for block_jobs in by_block.values():
        with block_jobs[0].op.enclosing_block:
            for job in block_jobs:
                replace_with_lut(job)
    return names


def handles(weights) -> bool:
    """Whether this pass palettises with ``weights``: our k-means, scalar, without per-channel scales
    (vector palettisation and per-channel scales stay with coremltools' pass)."""
    return (
        isinstance(weights, PalettizeWeights)
        and weights.algorithm == "kmeans"
        and weights.cluster_dim == 1
        and not weights.per_channel_scale
    )


def find_jobs(program, selection: WeightSelection, weight_threshold: int) -> list[PaletteJob]:
    """The const ops to palettise, in program order (the rules of coremltools' pass)."""
    jobs = []
    for op in iter_ops(program):
        if op.op_type != "const":
            continue
        weights = selection.for_const(op)
        if weights is None or not handles(weights):
            continue
        value = op.outputs[0].val
        if not _is_compressible(op, value, weight_threshold):
            continue
        input_axis, axis = select_input_output_channel_axis(op)
        if input_axis is None or axis is None:
            continue  # coremltools skips weights whose channel axes it cannot tell
        group_size = weights.group_size if weights.granularity == "per_grouped_channel" else 0
        if group_size and value.shape[axis] % group_size:
            continue  # channels must split into whole groups
        jobs.append(PaletteJob(op, value, weights.nbits, axis, group_size))
    return jobs


def _is_compressible(op, value, weight_threshold: int) -> bool:
    if not isinstance(value, np.ndarray) or value.dtype not in _FLOAT_WEIGHTS:
        return False
    children = op.outputs[0].child_ops
    if not children or any(child.op_type.startswith("constexpr_") for child in children):
        return False  # unused, or already feeding a decompression op
    # Core ML keeps constants of fewer than 10 elements inline; coremltools leaves them alone.
    return value.ndim > 1 and value.size >= 10 and value.size > weight_threshold


def cluster_jobs(jobs: list[PaletteJob], *, workers: int | None = None, packed: bool = False) -> None:
    """Fill each job's table and labels (or, with ``packed``, its packed labels only).

    float16 weights with one table each are clustered together from their histograms; the
    rest go to a thread pool, largest first so the cores finish together.
    """
    whole = [job for job in jobs if _is_whole_float16(job)]
    _cluster_whole_float16(whole, packed)
    workers = workers or cpu_threads()
    rest = sorted((job for job in jobs if not _is_whole_float16(job)), key=lambda job: job.value.size, reverse=True)

    def cluster(job: PaletteJob) -> None:
        _cluster(job)
        if packed:
            job.packed = pack_indices(job.labels, job.nbits)
            job.labels = None

    if workers == 1 or len(rest) <= 1:
        for job in rest:
            cluster(job)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(rest))) as pool:
        for done, _ in enumerate(pool.map(cluster, rest), 1):  # reported from this thread, the stage's
            report_progress("layers clustered", done, len(rest))


def _is_whole_float16(job: PaletteJob) -> bool:
    return job.value.dtype == np.float16 and not job.group_size and job.nbits <= 8


def _cluster_whole_float16(jobs: list[PaletteJob], packed: bool) -> None:
    """Per-tensor float16 jobs: one batched clustering, then labels by table look-up."""
    patterns = [np.ascontiguousarray(job.value).reshape(-1).view(np.uint16) for job in jobs]
    for nbits in sorted({job.nbits for job in jobs}):
        chosen = [index for index, job in enumerate(jobs) if job.nbits == nbits]
        luts, tables = palettize_fp16_tensors([patterns[i] for i in chosen], 1 << nbits)
        for index, lut, table in zip(chosen, luts, tables):
            job = jobs[index]
            job.lut = lut[None, :].astype(np.float16)
            if packed:
                job.packed = pack_looked_up(table, patterns[index], nbits)
            else:
                job.labels = table[patterns[index]].reshape(job.value.shape)


def _cluster(job: PaletteJob) -> None:
    value, axis = job.value, job.channel_axis
    moved = np.swapaxes(value, 0, axis) if axis else value
    channels = moved.shape[0]
    groups = channels // job.group_size if job.group_size else 1
    rows = np.ascontiguousarray(moved).reshape(groups, -1)
    luts, labels = palettize_groups(rows, 1 << job.nbits, workers=1, lut_dtype=value.dtype)
    labels = labels.reshape(moved.shape)
    job.labels = np.swapaxes(labels, 0, axis) if axis else labels
    job.lut = luts.astype(value.dtype)


def replace_with_lut(job: PaletteJob) -> None:
    """Swap the job's const for a ``constexpr_lut_to_dense`` op with the same consumers.

    Call inside ``with job.op.enclosing_block:`` (the builder adds ops to the current block).
    """
    op = job.op
    block = op.enclosing_block
    if is_current_opset_version_compatible_with(AvailableTarget.iOS18):
        new_var = mb.constexpr_lut_to_dense(
            indices=_as_sub_byte(job.labels, job.nbits),
            lut=_grouped_lut(job),
            before_op=op,
            name=op.name + "_palettized",
        )
    else:
        if job.lut.shape[0] != 1:
            raise BuildError(
                f"{op.name}: per-grouped-channel palettisation needs an iOS18 program",
                hint="raise target.deployment_target to iOS18 or use granularity per_tensor",
            )
        (lut,) = job.lut
        new_var = mb.constexpr_lut_to_dense(
            indices=pack_indices(job.labels, job.nbits),
            lut=lut,
            shape=np.array(job.value.shape, dtype=np.uint32),
            before_op=op,
            name=op.name + "_palettized",
        )
    block.replace_uses_of_var_after_op(
        anchor_op=op, old_var=op.outputs[0], new_var=new_var, no_check_var_types=True
    )
    block.remove_ops([op])


def _as_sub_byte(labels: np.ndarray, nbits: int) -> np.ndarray:
    """The same bytes, typed as MIL's uint<nbits> so the writer stores nbits per index."""
    return labels.view(types.nptype_from_builtin(types.string_to_builtin(f"uint{nbits}")))


def _grouped_lut(job: PaletteJob) -> np.ndarray:
    """iOS18 table layout: one [2^nbits, 1] table per channel group, broadcast over the rest."""
    shape = [1] * job.value.ndim
    shape[job.channel_axis] = job.lut.shape[0]
    return job.lut.reshape(*shape, 1 << job.nbits, 1)

