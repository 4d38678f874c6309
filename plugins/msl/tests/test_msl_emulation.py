"""The MSL emulation against numpy: each kernel runs on the CPU and must match its reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import msl_kernels as kernels  # noqa: E402

from edgebuild_msl import check_kernel, compile_kernel  # noqa: E402

rng = np.random.default_rng(7)


def test_vector_add_matches_numpy():
    a, b = rng.standard_normal(1000, np.float32), rng.standard_normal(1000, np.float32)
    out = compile_kernel(kernels.vector_add()).run({"a": a, "b": b})
    np.testing.assert_array_equal(out["c"], a + b)


def test_vector_types_swizzles_and_half():
    x = rng.standard_normal((100, 4)).astype(np.float32)
    out = compile_kernel(kernels.vector_mix()).run({"x": x}, {"scale": 0.5})
    expected = kernels.vector_mix().run_reference({"x": x}, {"scale": 0.5})["y"]
    assert out["y"].dtype == np.float16
    np.testing.assert_allclose(out["y"].astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("m,k,n", [(32, 48, 16), (37, 50, 29)])  # whole tiles, then ragged edges
def test_tiled_matmul_with_threadgroup_memory_and_barriers(m, k, n):
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    out = compile_kernel(kernels.tiled_matmul()).run({"A": a, "B": b})
    np.testing.assert_allclose(out["C"], a @ b, rtol=1e-5, atol=1e-4)


def test_simd_sum_reduction():
    x = rng.standard_normal((5, 1000)).astype(np.float32)
    out = compile_kernel(kernels.row_sum()).run({"x": x})
    np.testing.assert_allclose(out["y"], x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_simd_sum_with_partial_last_simdgroup():
    # 80 lanes: two full SIMD-groups and one of 16
    assert check_kernel(kernels.row_sum(threads=80), {"x": rng.standard_normal((3, 333)).astype(np.float32)}) < 1e-4


def test_simd_shuffles_follow_metal_semantics():
    x = rng.standard_normal(100).astype(np.float32)  # threadgroups of 64: SIMD-groups of 32, 32, 32 and 4
    out = compile_kernel(kernels.simd_shuffles()).run({"x": x})
    np.testing.assert_array_equal(out["y"][:, 0][:31], x[1:32])  # shuffle_down(1) within the first group
    assert out["y"][31, 0] == x[31]  # the top lane keeps its value
    np.testing.assert_array_equal(out["y"], kernels.simd_shuffles().run_reference({"x": x})["y"])


def test_softmax_with_threadgroup_reductions():
    x = (rng.standard_normal((6, 300)) * 4).astype(np.float32)
    out = compile_kernel(kernels.softmax()).run({"x": x})
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["y"], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_threadgroup_atomics():
    x = rng.standard_normal(300).astype(np.float32)
    out = compile_kernel(kernels.positive_count()).run({"x": x})
    np.testing.assert_array_equal(out["counts"], [(x[i:i + 64] > 0).sum() for i in range(0, 300, 64)])


def test_unwritten_output_reads_as_nan_and_fails_the_check():
    lazy = kernels.VECTOR_ADD.replace("if (gid >= n) return;", "if (gid >= n || gid == 3) return;")
    assert check_kernel(kernels.vector_add(lazy), {"a": np.ones(8, np.float32), "b": np.ones(8, np.float32)}) == np.inf


def test_barrier_after_early_return_is_reported():
    from edgebuild_msl import KernelError

    bad = kernels.SOFTMAX.replace("float m = -INFINITY;", "if (lid == 3) return;\n    float m = -INFINITY;")
    spec = kernels.softmax()
    spec.source = bad
    with pytest.raises(KernelError, match="not reached by every thread"):
        compile_kernel(spec).run({"x": np.ones((1, 16), np.float32)})
