"""Kernels the emulation tests run, each declared as an op plugin would declare it."""

from __future__ import annotations

import numpy as np

from edgebuild_msl import ConstantBinding, KernelSpec, TensorDecl

VECTOR_ADD = """
#include <metal_stdlib>
using namespace metal;

kernel void vector_add(device const float* a [[buffer(0)]],
                       device const float* b [[buffer(1)]],
                       device float* c [[buffer(2)]],
                       constant uint& n [[buffer(3)]],
                       uint gid [[thread_position_in_grid]]) {
    if (gid >= n) return;
    c[gid] = a[gid] + b[gid];
}
"""


def vector_add(source: str = VECTOR_ADD) -> KernelSpec:
    return KernelSpec(
        domain="test.msl", op_type="VectorAdd",
        inputs=[TensorDecl("a", "float32", 1), TensorDecl("b", "float32", 1)],
        outputs=[TensorDecl("c", "float32", 1)],
        source=source, entry="vector_add", buffers={"a": 0, "b": 1, "c": 2},
        constants=[ConstantBinding("n", 3, "uint", lambda shapes: shapes["a"][0])],
        grid=lambda shapes: (shapes["a"][0], 1, 1), threadgroup=(256, 1, 1),
        output_shapes=lambda shapes: {"c": shapes["a"]},
        reference=lambda a, b: a + b,
    )


# float4 loads, swizzles, half arithmetic and MSL's fast:: functions in one kernel.
VECTOR_MIX = """
#include <metal_stdlib>
using namespace metal;

kernel void vector_mix(device const float4* x [[buffer(0)]],
                       device half4* y [[buffer(1)]],
                       constant float& scale [[buffer(2)]],
                       uint gid [[thread_position_in_grid]]) {
    float4 v = x[gid];
    float2 lo = v.xy * scale;
    float4 w = float4(v.wz, lo);       // (v.w, v.z, v.x*s, v.y*s)
    w.x = fast::exp(w.x) - 1.0f;
    w.yz = max(w.yz, float2(0.0f));
    half4 h = half4(w);
    h.w = h.w * 2.0h;
    y[gid] = h;
}
"""


def vector_mix() -> KernelSpec:
    def reference(x, *, scale):
        x = x.astype(np.float32)
        w = np.stack([x[:, 3], x[:, 2], x[:, 0] * scale, x[:, 1] * scale], axis=1)
        w[:, 0] = np.exp(w[:, 0]) - 1.0
        w[:, 1:3] = np.maximum(w[:, 1:3], 0.0)
        h = w.astype(np.float16)
        h[:, 3] = h[:, 3] * np.float16(2.0)
        return h

    return KernelSpec(
        domain="test.msl", op_type="VectorMix",
        inputs=[TensorDecl("x", "float32", 2)], outputs=[TensorDecl("y", "float16", 2)],
        source=VECTOR_MIX, entry="vector_mix", buffers={"x": 0, "y": 1},
        constants=[ConstantBinding("scale", 2, "float", "scale")], attributes={"scale": 1.0},
        grid=lambda shapes: (shapes["x"][0], 1, 1), threadgroup=(64, 1, 1),
        output_shapes=lambda shapes: {"y": shapes["x"]}, reference=reference,
    )


TILED_MATMUL = """
#include <metal_stdlib>
using namespace metal;
#define TILE 16

kernel void tiled_matmul(device const float* A [[buffer(0)]],
                         device const float* B [[buffer(1)]],
                         device float* C [[buffer(2)]],
                         constant uint& M [[buffer(3)]],
                         constant uint& K [[buffer(4)]],
                         constant uint& N [[buffer(5)]],
                         uint2 gid [[thread_position_in_grid]],
                         uint2 lid [[thread_position_in_threadgroup]]) {
    threadgroup float As[TILE][TILE];
    threadgroup float Bs[TILE][TILE];
    float acc = 0.0f;
    for (uint t = 0; t < (K + TILE - 1) / TILE; ++t) {
        uint ak = t * TILE + lid.x;
        uint bk = t * TILE + lid.y;
        As[lid.y][lid.x] = (gid.y < M && ak < K) ? A[gid.y * K + ak] : 0.0f;
        Bs[lid.y][lid.x] = (bk < K && gid.x < N) ? B[bk * N + gid.x] : 0.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);  // tiles loaded
        for (uint k = 0; k < TILE; ++k) {
            acc = fma(As[lid.y][k], Bs[k][lid.x], acc);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // tiles consumed
    }
    if (gid.y < M && gid.x < N) {
        C[gid.y * N + gid.x] = acc;
    }
}
"""
LOADED_BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);  // tiles loaded"


def tiled_matmul(source: str = TILED_MATMUL) -> KernelSpec:
    tile = 16

    def padded(n):
        return -(-n // tile) * tile

    return KernelSpec(
        domain="test.msl", op_type="TiledMatMul",
        inputs=[TensorDecl("A", "float32", 2), TensorDecl("B", "float32", 2)], outputs=[TensorDecl("C", "float32", 2)],
        source=source, entry="tiled_matmul", buffers={"A": 0, "B": 1, "C": 2},
        constants=[ConstantBinding("M", 3, "uint", lambda s: s["A"][0]), ConstantBinding("K", 4, "uint", lambda s: s["A"][1]),
                   ConstantBinding("N", 5, "uint", lambda s: s["B"][1])],
        # every lane of a tile must reach the barriers, so the grid is padded to whole tiles
        grid=lambda s: (padded(s["B"][1]), padded(s["A"][0]), 1), threadgroup=(tile, tile, 1),
        output_shapes=lambda s: {"C": (s["A"][0], s["B"][1])},
        reference=lambda A, B: (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32),
    )


ROW_SUM = """
#include <metal_stdlib>
using namespace metal;

kernel void row_sum(device const float* x [[buffer(0)]],
                    device float* y [[buffer(1)]],
                    constant uint& cols [[buffer(2)]],
                    uint row [[threadgroup_position_in_grid]],
                    uint lid [[thread_index_in_threadgroup]],
                    uint size [[threads_per_threadgroup]],
                    uint lane [[thread_index_in_simdgroup]],
                    uint simd_group [[simdgroup_index_in_threadgroup]],
                    uint simd_groups [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float acc = 0.0f;
    for (uint i = lid; i < cols; i += size) {
        acc += x[row * cols + i];
    }
    acc = simd_sum(acc);
    if (lane == 0) {
        partial[simd_group] = acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (simd_group == 0) {
        float v = lane < simd_groups ? partial[lane] : 0.0f;
        v = simd_sum(v);
        if (simd_is_first()) {
            y[row] = v;
        }
    }
}
"""


def row_sum(threads: int = 256) -> KernelSpec:
    return KernelSpec(
        domain="test.msl", op_type="RowSum",
        inputs=[TensorDecl("x", "float32", 2)], outputs=[TensorDecl("y", "float32", 1)],
        source=ROW_SUM, entry="row_sum", buffers={"x": 0, "y": 1},
        constants=[ConstantBinding("cols", 2, "uint", lambda s: s["x"][1])],
        grid=lambda s: (s["x"][0] * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=lambda s: {"y": (s["x"][0],)},
        reference=lambda x: x.astype(np.float64).sum(axis=1).astype(np.float32),
    )


# Shuffles: out = (shuffle_down(x, 1), shuffle_up(x, 2), broadcast(x, 5), shuffle_xor(x, 3))
SIMD_SHUFFLES = """
#include <metal_stdlib>
using namespace metal;

kernel void simd_shuffles(device const float* x [[buffer(0)]],
                          device float4* y [[buffer(1)]],
                          uint gid [[thread_position_in_grid]]) {
    float v = x[gid];
    y[gid] = float4(simd_shuffle_down(v, 1), simd_shuffle_up(v, 2), simd_broadcast(v, 5), simd_shuffle_xor(v, 3));
}
"""


def simd_shuffles() -> KernelSpec:
    def reference(x):
        out = np.empty((x.shape[0], 4), np.float32)
        for start in range(0, x.shape[0], 32):
            g = x[start:start + 32]
            n = len(g)
            lanes = np.arange(n)
            out[start:start + n, 0] = g[np.where(lanes + 1 < n, lanes + 1, lanes)]
            out[start:start + n, 1] = g[np.where(lanes >= 2, lanes - 2, lanes)]
            out[start:start + n, 2] = g[5] if n > 5 else g
            out[start:start + n, 3] = g[np.where((lanes ^ 3) < n, lanes ^ 3, lanes)]
        return out

    return KernelSpec(
        domain="test.msl", op_type="SimdShuffles",
        inputs=[TensorDecl("x", "float32", 1)], outputs=[TensorDecl("y", "float32", 2)],
        source=SIMD_SHUFFLES, entry="simd_shuffles", buffers={"x": 0, "y": 1},
        grid=lambda s: (s["x"][0], 1, 1), threadgroup=(64, 1, 1),
        output_shapes=lambda s: {"y": (s["x"][0], 4)}, reference=reference,
    )


SOFTMAX = """
#include <metal_stdlib>
using namespace metal;

// One threadgroup per row; tree reductions in threadgroup memory for the max and the sum.
kernel void softmax_rows(device const float* x [[buffer(0)]],
                         device float* y [[buffer(1)]],
                         constant uint& cols [[buffer(2)]],
                         threadgroup float* scratch [[threadgroup(0)]],
                         uint row [[threadgroup_position_in_grid]],
                         uint lid [[thread_position_in_threadgroup]],
                         uint size [[threads_per_threadgroup]]) {
    device const float* in = x + row * cols;
    device float* out = y + row * cols;

    float m = -INFINITY;
    for (uint i = lid; i < cols; i += size) m = max(m, in[i]);
    scratch[lid] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = size / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = max(scratch[lid], scratch[lid + s]);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    const float row_max = scratch[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);

    float sum = 0.0f;
    for (uint i = lid; i < cols; i += size) sum += exp(in[i] - row_max);
    scratch[lid] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = size / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    const float inv = 1.0f / scratch[0];
    for (uint i = lid; i < cols; i += size) out[i] = exp(in[i] - row_max) * inv;
}
"""


def softmax(threads: int = 128) -> KernelSpec:
    def reference(x):
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    return KernelSpec(
        domain="test.msl", op_type="Softmax",
        inputs=[TensorDecl("x", "float32", 2)], outputs=[TensorDecl("y", "float32", 2)],
        source=SOFTMAX, entry="softmax_rows", buffers={"x": 0, "y": 1},
        constants=[ConstantBinding("cols", 2, "uint", lambda s: s["x"][1])],
        threadgroup_memory={0: threads * 4},
        grid=lambda s: (s["x"][0] * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=lambda s: {"y": s["x"]}, reference=reference,
    )


POSITIVE_COUNT = """
#include <metal_stdlib>
using namespace metal;

// Per threadgroup of 64 values: how many are positive, counted with a threadgroup atomic.
kernel void positive_count(device const float* x [[buffer(0)]],
                           device uint* counts [[buffer(1)]],
                           uint gid [[thread_position_in_grid]],
                           uint lid [[thread_index_in_threadgroup]],
                           uint group [[threadgroup_position_in_grid]]) {
    threadgroup atomic_uint count;
    if (lid == 0) atomic_store_explicit(&count, 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (x[gid] > 0.0f) atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lid == 0) counts[group] = atomic_load_explicit(&count, memory_order_relaxed);
}
"""


def positive_count() -> KernelSpec:
    return KernelSpec(
        domain="test.msl", op_type="PositiveCount",
        inputs=[TensorDecl("x", "float32", 1)], outputs=[TensorDecl("counts", "uint32", 1)],
        source=POSITIVE_COUNT, entry="positive_count", buffers={"x": 0, "counts": 1},
        grid=lambda s: (s["x"][0], 1, 1), threadgroup=(64, 1, 1),
        output_shapes=lambda s: {"counts": (-(-s["x"][0] // 64),)},
        reference=lambda x: np.array([(x[i:i + 64] > 0).sum() for i in range(0, len(x), 64)], np.uint32),
    )
