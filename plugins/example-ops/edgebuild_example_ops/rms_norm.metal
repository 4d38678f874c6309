#include <metal_stdlib>
using namespace metal;

// One threadgroup per row of X ([rows, D]): each thread sums the squares of a strided slice,
// simd_sum folds a SIMD-group, threadgroup memory folds the SIMD-groups.
kernel void rms_norm(device const float* x [[buffer(0)]],
                     device const float* scale [[buffer(1)]],
                     device float* y [[buffer(2)]],
                     constant uint& d [[buffer(3)]],
                     constant float& epsilon [[buffer(4)]],
                     uint row [[threadgroup_position_in_grid]],
                     uint lid [[thread_index_in_threadgroup]],
                     uint size [[threads_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]],
                     uint simd_group [[simdgroup_index_in_threadgroup]],
                     uint simd_groups [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    device const float* in = x + row * d;
    device float* out = y + row * d;

    float acc = 0.0f;
    for (uint i = lid; i < d; i += size) acc = fma(in[i], in[i], acc);
    acc = simd_sum(acc);
    if (lane == 0) partial[simd_group] = acc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = lane < simd_groups ? partial[lane] : 0.0f;
    total = simd_sum(total);

    const float inv_rms = rsqrt(total / float(d) + epsilon);
    for (uint i = lid; i < d; i += size) out[i] = in[i] * inv_rms * scale[i];
}
