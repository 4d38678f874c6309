"""Normalisations of onnxruntime's transformer optimiser: SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization and EmbedLayerNormalization.

Each is a sum (residual, bias, embeddings) followed by LayerNormalization or RMS
normalisation; the normalisation itself is norm.py's / rms_norm.py's. Semantics follow
onnxruntime's contrib-op schemas and its CPU kernels.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb

from edgebuild_coreml.lowering.ops._nn_util import as_float
from edgebuild_coreml.lowering.ops._util import dim, wanted
from edgebuild_coreml.lowering.ops.norm import layer_norm
from edgebuild_coreml.lowering.ops.rms_norm import rms_norm
from edgebuild_coreml.lowering.registry import lowers

DOMAIN = "com.microsoft"
# onnxruntime's schema defaults
SKIP_EPSILON = 1e-12
SIMPLIFIED_EPSILON = 1e-5


def _wants(node, index: int) -> bool:
    return index < len(node.outputs) and wanted(node.outputs[index])


def _sum(ctx, node, terms, name: str):
    """terms[0] + terms[1] + ... (None entries skipped), the last add named ``name``."""
    terms = [t for t in terms if t is not None]
    total = terms[0]
    for i, term in enumerate(terms[1:], start=2):
        total = mb.add(x=total, y=term, name=name if i == len(terms) else ctx.name(node, f"{name}_partial"))
    return total


def _skip_sum(ctx, node, bias_index: int):
    """input + skip (+ bias): the residual sum both skip normalisations start from (skip may
    be (S, H) or (1, S, H) against a (B, S, H) input: numpy broadcasting covers both)."""
    x, skip = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    bias = as_float(ctx.input(node, bias_index, optional=True))
    return _sum(ctx, node, [x, skip, bias], ctx.name(node, "input_skip_bias_sum"))


@lowers("SkipLayerNormalization", domain=DOMAIN)
def skip_layer_normalization(ctx, node):
    """LayerNorm(input + skip + bias) * gamma + beta over the last axis; outputs mean,
    inv_std_var (kept dims) and the sum when asked for."""
    total = _skip_sum(ctx, node, bias_index=4)
    gamma, beta = as_float(ctx.input(node, 2)), as_float(ctx.input(node, 3, optional=True))
    epsilon = float(ctx.attr(node, "epsilon", SKIP_EPSILON))
    stats = _wants(node, 1) or _wants(node, 2)
    normed = layer_norm(ctx, node, total, gamma, beta, -1, epsilon, stats=stats)
    y, mean, inv_std = normed if stats else (normed, None, None)
    return y, mean, inv_std, total if _wants(node, 3) else None


@lowers("SkipSimplifiedLayerNormalization", domain=DOMAIN)
def skip_simplified_layer_normalization(ctx, node):
    """RMSNorm(input + skip + bias) * gamma over the last axis; outputs inv_std_var (kept dims)
    and the sum when asked for. Its ``mean`` output is not defined: an RMS norm takes none."""
    if _wants(node, 1):
        ctx.fail(node, "the mean output is used, but an RMS normalisation computes no mean",
                 "use the output, inv_std_var or input_skip_bias_sum outputs only")
    total = _skip_sum(ctx, node, bias_index=3)
    gamma = as_float(ctx.input(node, 2))
    epsilon = float(ctx.attr(node, "epsilon", SKIP_EPSILON))
    y, inv_rms = rms_norm(ctx, node, total, gamma, -1, epsilon, inv_rms=True)
    return y, None, inv_rms if _wants(node, 2) else None, total if _wants(node, 3) else None


@lowers("SimplifiedLayerNormalization")
def simplified_layer_normalization(ctx, node):
    """RMS normalisation over dims axis..; onnxruntime registers it in the ONNX domain (opset 1),
    which is where its optimiser writes it. ``stash_type`` only sets the precision onnxruntime
    keeps statistics in; the artifact computes in its own precision."""
    x, scale = as_float(ctx.input(node, 0)), as_float(ctx.input(node, 1))
    axis = int(ctx.attr(node, "axis", -1))
    epsilon = float(ctx.attr(node, "epsilon", SIMPLIFIED_EPSILON))
    y, inv_rms = rms_norm(ctx, node, x, scale, axis, epsilon, inv_rms=True)
    return y, inv_rms if _wants(node, 1) else None


@lowers("EmbedLayerNormalization", domain=DOMAIN)
def embed_layer_normalization(ctx, node):
    """LayerNorm(word[input_ids] + position[position_ids] + segment[segment_ids]) * gamma + beta.

    Positions default to 0..S-1 for every batch row; the segment term is left out when
    segment_ids / segment_embedding are absent. Outputs: the mask index (per batch row, the
    count of mask entries equal to 1, as onnxruntime counts; zeros without a mask) and the
    sum before normalisation, when asked for.
    """
    ids = ctx.input(node, 0)
    segment_ids = ctx.input(node, 1, optional=True)
    word, position = as_float(ctx.input(node, 2)), as_float(ctx.input(node, 3))
    segment = as_float(ctx.input(node, 4, optional=True))
    gamma, beta = as_float(ctx.input(node, 5)), as_float(ctx.input(node, 6))
    mask = ctx.input(node, 7, optional=True)
    position_ids = ctx.input(node, 8, optional=True)
    epsilon = float(ctx.attr(node, "epsilon", SKIP_EPSILON))
    if (segment_ids is None) != (segment is None):
        ctx.fail(node, "segment_ids and segment_embedding must be given together")

    terms = [mb.gather(x=word, indices=ids, axis=0, name=ctx.name(node, "word"))]
    if position_ids is None:  # 0..S-1, broadcast over the batch
        length = dim(ids, 1)
        if isinstance(length, np.integer):
            position_ids = np.arange(int(length), dtype=np.int32)
        else:
            position_ids = mb.range_1d(start=np.int32(0), end=length, step=np.int32(1),
                                       name=ctx.name(node, "positions"))
    terms.append(mb.gather(x=position, indices=position_ids, axis=0, name=ctx.name(node, "position")))
    if segment is not None:
        terms.append(mb.gather(x=segment, indices=segment_ids, axis=0, name=ctx.name(node, "segment")))
    total = _sum(ctx, node, terms, ctx.name(node, "embedding_sum"))
    y = layer_norm(ctx, node, total, gamma, beta, -1, epsilon)
    return y, _mask_index(ctx, node, ids, mask) if _wants(node, 1) else None, total if _wants(node, 2) else None


def _mask_index(ctx, node, ids, mask):
    """Per batch row, how many mask entries equal 1 (int32 [B]); zeros when there is no mask."""
    if mask is None:
        zeros = mb.reduce_sum(x=mb.mul(x=ids, y=np.int32(0)), axes=[1],
                              name=ctx.name(node, "no_mask"))
        return mb.identity(x=zeros, name=ctx.name(node, "mask_index"))
    if isinstance(mask, np.ndarray):
        mask = mask.astype(np.int32)
    ones = mb.cast(x=mb.equal(x=mask, y=np.int32(1), name=ctx.name(node, "mask_is_one")), dtype="int32",
                   name=ctx.name(node, "mask_ones"))
    return mb.reduce_sum(x=ones, axes=[1], keep_dims=False, name=ctx.name(node, "mask_index"))
