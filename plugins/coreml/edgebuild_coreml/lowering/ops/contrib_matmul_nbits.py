"""MatMulNBits: A @ dequantise(B).T (+ bias), B quantised to 2, 4 or 8 bits in blocks along K.

The weight stays quantised in the package: one ``constexpr_blockwise_shift_scale`` holding
the [N, K] codes at 4 bits (2-bit codes are widened to 4: Core ML has no 2-bit shift-scale
data) or 8 bits, with per-block scales and zero points, which Core ML expands at load time.
That op exists from iOS18; on older targets the node is refused rather than inflated to a
float weight 8 times its size.

onnxruntime's layout (docs/ContribOperators.md, com.microsoft.MatMulNBits):
- B: uint8 [N, k_blocks, block_size * bits / 8], codes packed low bits first along K;
- scales: [N, k_blocks] (or flat), zero_points: uint8 packed the same way [N, ceil(k_blocks *
  bits / 8)] or float [N, k_blocks]; absent, the zero point is 2^(bits - 1);
- dequantised weight [n, k] = (code - zero_point[n, block]) * scale[n, block];
- g_idx [K] (act-order): row k's block is g_idx[k] instead of k // block_size. Sorting K by
  g_idx makes each block's rows contiguous again, so the weight's K rows and A's last axis
  are permuted the same way and the blocks are ordinary ones.
K need not be a multiple of block_size: the last block is padded in B, and A gets zeros there.
``accuracy_level`` only lets onnxruntime compute A in lower precision; the artifact computes
A in its own precision.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild_coreml.lowering.ops._nn_util import as_float, float_np, rank_of, shape_of
from edgebuild_coreml.lowering.ops._util import is_static
from edgebuild_coreml.lowering.registry import lowers

DOMAIN = "com.microsoft"
SUPPORTED_BITS = (2, 4, 8)


def unpack_codes(packed: np.ndarray, bits: int, rows: int, count: int) -> np.ndarray:
    """uint8 bytes holding ``8 // bits`` codes each, low bits first -> [rows, count] codes."""
    per_byte = 8 // bits
    data = np.asarray(packed, dtype=np.uint8).reshape(rows, -1)
    mask = np.uint8((1 << bits) - 1)
    codes = np.stack([(data >> np.uint8(bits * j)) & mask for j in range(per_byte)], axis=-1)
    return codes.reshape(rows, -1)[:, :count]


def _block_order(ctx, node, g_idx: np.ndarray, k: int, block: int) -> np.ndarray | None:
    """The permutation of K that makes g_idx's blocks contiguous (None: already in order)."""
    groups = np.asarray(g_idx).reshape(-1).astype(np.int64)
    if groups.shape != (k,):
        ctx.fail(node, f"g_idx has {groups.size} entries; it needs one per row of K ({k})")
    order = np.argsort(groups, kind="stable")
    if not np.array_equal(groups[order], np.arange(k) // block):
        ctx.fail(node, f"g_idx must put exactly block_size ({block}) rows of K in each block "
                 "(the remainder in the last) for Core ML's blockwise weights")
    return None if np.array_equal(order, np.arange(k)) else order.astype(np.int32)


def _zero_points(ctx, node, zero, bits: int, n: int, blocks: int, dtype):
    """Zero points as [N, k_blocks]: integer codes (uint8 packed), floats, or None (the default)."""
    if zero is None:
        return None
    if zero.dtype == np.uint8:
        return unpack_codes(zero, bits, n, blocks)
    if zero.dtype.kind == "f":
        if zero.size != n * blocks:
            ctx.fail(node, f"float zero_points have {zero.size} values; expected N * k_blocks = {n * blocks}")
        return zero.reshape(n, blocks).astype(dtype)
    ctx.fail(node, f"zero_points of type {zero.dtype} are not supported", "use uint8 (packed) or float zero points")


def compressed_weight(codes: np.ndarray, scales: np.ndarray, zero, bits: int, name: str):
    """``constexpr_blockwise_shift_scale`` for the [N, K_padded] codes (blocks along K).

    Without zero points the codes are stored signed (code - 2^(bits-1)) with no offset;
    integer zero points are stored as an offset of the codes' type, float ones as a float offset.
    """
    narrow = bits <= 4
    if zero is None:
        data = (codes.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)
        data = data.astype(types.np_int4_dtype if narrow else np.int8)
        return mb.constexpr_blockwise_shift_scale(data=data, scale=scales, name=name)
    unsigned = types.np_uint4_dtype if narrow else np.uint8
    offset = zero if zero.dtype.kind == "f" else zero.astype(unsigned)
    return mb.constexpr_blockwise_shift_scale(data=codes.astype(unsigned), scale=scales, offset=offset, name=name)


@lowers("MatMulNBits", domain=DOMAIN)
def matmul_nbits(ctx, node):
    ctx.require_target(node, "iOS18", "its blockwise-quantised weight is kept compressed with "
                       "constexpr_blockwise_shift_scale, which Core ML has from iOS18")
    bits, block = int(ctx.attr(node, "bits", 4)), int(ctx.attr(node, "block_size"))
    k, n = int(ctx.attr(node, "K")), int(ctx.attr(node, "N"))
    if bits not in SUPPORTED_BITS:
        ctx.fail(node, f"bits={bits} is not supported", "quantise to 2, 4 or 8 bits")
    if int(ctx.attr(node, "weight_prepacked", 0)):
        ctx.fail(node, "B is prepacked in an execution provider's own layout", "export the model with weight_prepacked=0")
    a = as_float(ctx.input(node, 0))
    packed = ctx.const(node, 1, what="B (the packed weights)")
    scales = ctx.const(node, 2, what="scales")
    zero = ctx.const(node, 3, optional=True, what="zero_points")
    g_idx = ctx.const(node, 4, optional=True, what="g_idx")
    bias = as_float(ctx.input(node, 5, optional=True))
    blocks = -(-k // block)
    if packed.size == 0:
        ctx.fail(node, "B is empty (an omitted projection)", "remove the node or give it weights")
    if packed.size != n * blocks * block * bits // 8:
        ctx.fail(node, f"B has {packed.size} bytes; N={n}, K={k}, block_size={block}, bits={bits} need "
                 f"{n * blocks * block * bits // 8}")
    if scales.size != n * blocks:
        ctx.fail(node, f"scales have {scales.size} values; expected N * k_blocks = {n * blocks}")
    last = shape_of(a)[-1] if rank_of(a) else None
    if last is None or (is_static(last) and int(last) != k):
        ctx.fail(node, f"A's last axis is {last}; K is {k}")

    codes = unpack_codes(packed, bits, n, blocks * block)
    order = None if g_idx is None else _block_order(ctx, node, g_idx, k, block)
    x = a
    if order is not None:
        codes[:, :k] = codes[:, order]
        x = mb.gather(x=x, indices=order, axis=-1, name=ctx.name(node, "A_block_order"))
    if blocks * block > k:  # the padding rows of the last block meet zeros of A
        pad = [0, 0] * (rank_of(x) - 1) + [0, blocks * block - k]
        x = mb.pad(x=x, pad=np.array(pad, np.int32), mode="constant", constant_val=0.0, name=ctx.name(node, "A_padded"))
    # the weight comes out in A's float type (an fp16 source stays fp16)
    dtype = float_np(x)
    zero = _zero_points(ctx, node, zero, bits, n, blocks, dtype)
    weight = compressed_weight(codes, scales.reshape(n, blocks).astype(dtype), zero, bits, ctx.name(node, "weight"))
    return _product(ctx, node, x, weight, bias, n)


def _product(ctx, node, x, weight, bias, n: int):
    """x @ weight.T + bias: ``linear`` where MIL allows its rank, else matmul and add."""
    dtype = float_np(x)
    if rank_of(x) <= 3 and (bias is None or isinstance(bias, np.ndarray)):
        vector = np.zeros([n], dtype) if bias is None else np.broadcast_to(bias, [n]).astype(dtype)
        return mb.linear(x=x, weight=weight, bias=vector, name=ctx.name(node))
    product = mb.matmul(x=x, y=weight, transpose_y=True, name=ctx.name(node) if bias is None else ctx.name(node, "matmul"))
    if bias is None:
        return product
    return mb.add(x=product, y=bias.astype(dtype) if isinstance(bias, np.ndarray) else bias, name=ctx.name(node))
