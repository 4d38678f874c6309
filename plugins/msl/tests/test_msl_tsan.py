"""ThreadSanitizer mode: a missing barrier is a reported race; correct kernels run clean."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import msl_kernels as kernels  # noqa: E402

from edgebuild_msl import KernelRace, check_kernel, compile_kernel  # noqa: E402

rng = np.random.default_rng(3)
MATMUL_INPUTS = {"A": rng.standard_normal((20, 40)).astype(np.float32), "B": rng.standard_normal((40, 18)).astype(np.float32)}


def test_tsan_reports_tiled_matmul_without_its_barrier():
    assert kernels.LOADED_BARRIER in kernels.TILED_MATMUL
    racy = kernels.tiled_matmul(kernels.TILED_MATMUL.replace(kernels.LOADED_BARRIER, ""))
    with pytest.raises(KernelRace) as info:
        compile_kernel(racy, tsan=True).run(MATMUL_INPUTS)
    message = str(info.value)
    assert "data race" in message and "tiled_matmul.metal:" in message
    assert "Write of size 4" in message  # the racing accesses, each at a kernel line


@pytest.mark.slow
@pytest.mark.parametrize("make,inputs", [
    (kernels.tiled_matmul, MATMUL_INPUTS),
    (kernels.softmax, {"x": rng.standard_normal((2, 100)).astype(np.float32)}),
    (kernels.row_sum, {"x": rng.standard_normal((2, 300)).astype(np.float32)}),
    (kernels.positive_count, {"x": rng.standard_normal(128).astype(np.float32)}),
])
def test_correct_kernels_are_race_free(make, inputs):
    assert check_kernel(make(), inputs, tsan=True) < 1e-4


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the non-macOS refusal")
def test_metallib_needs_macos():
    from edgebuild_msl import KernelError
    from edgebuild_msl.metallib import build_metallib, metal_toolchain_available

    assert not metal_toolchain_available()
    with pytest.raises(KernelError, match="needs macOS"):
        build_metallib(kernels.vector_add(), Path("unused.metallib"))


@pytest.mark.skipif(sys.platform != "darwin", reason="xcrun metal runs on macOS only")
def test_metallib_builds_on_macos(tmp_path):
    from edgebuild_msl.metallib import build_metallib

    assert build_metallib(kernels.vector_add(), tmp_path / "k.metallib").stat().st_size > 0
