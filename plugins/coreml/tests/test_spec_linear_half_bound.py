"""Symmetric quantisation of fp16 weights takes each block's bound from the fp16 bits, and the
compress stage's temporaries reuse freed heap memory: the stored bytes are the plain rule's."""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys

import numpy as np
import pytest

from edgebuild_coreml.compress import spec_linear
from edgebuild_coreml.compress.config import LinearWeights

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_compress_speed_equivalence import LAYOUTS, _same_bytes, plain_quantize  # noqa: E402

SYMMETRIC = [LinearWeights(mode="linear", dtype=dtype, symmetric=True) for dtype in ("int8", "int4", "uint8", "uint4")]
TINY = np.float16(6e-8)  # the smallest fp16 subnormal


def half_weights_with_special_blocks(shape, seed: int) -> np.ndarray:
    """fp16 weights whose leading rows hold the values whose bits order magnitude at the edges:
    NaN, +-inf, signed zeros, subnormals, the largest finite value, a negative largest magnitude."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal(shape) * 0.02).astype(np.float16)
    flat = weight.reshape(shape[0], -1)
    flat[0, ::5] = np.nan
    flat[1, 3] = np.inf
    flat[2, 1] = -np.inf
    flat[3] = -0.0
    flat[4] = TINY * rng.integers(-3, 4, flat.shape[1])
    flat[5, 0] = np.float16(65504)
    flat[6] = -np.abs(flat[6])
    flat[6, 2] = np.float16(-300.0)
    return weight


def _block_axes(shape, block_sizes):
    blocked, axes = [], []
    for dim, block in zip(shape, block_sizes):
        blocked += [dim // block, block] if block else [dim]
        axes.append(len(blocked) - 1)
    return blocked, tuple(axes)


@pytest.mark.parametrize("granularity", sorted(LAYOUTS))
def test_half_bound_is_the_larger_of_minus_min_and_max(granularity):
    for index, (shape, block_sizes) in enumerate(LAYOUTS[granularity]):
        weight = half_weights_with_special_blocks(shape, seed=index)
        blocked, axes = _block_axes(shape, block_sizes)
        values = weight.astype(np.float32).reshape(blocked)
        expected = np.maximum(-values.min(axis=axes, keepdims=True), values.max(axis=axes, keepdims=True))
        found = spec_linear.half_block_magnitude(weight.reshape(blocked), axes)
        assert found.dtype == np.float32 and found.shape == expected.shape
        np.testing.assert_array_equal(found, expected)  # NaN where the block holds one


@pytest.mark.parametrize("granularity", sorted(LAYOUTS))
def test_symmetric_half_weights_store_the_plain_rules_bytes_with_special_values(granularity):
    for (index, (shape, block_sizes)), config in itertools.product(enumerate(LAYOUTS[granularity]), SYMMETRIC):
        weight = half_weights_with_special_blocks(shape, seed=10 + index)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ours = spec_linear._quantize_blockwise(weight, config, block_sizes)
            plain = plain_quantize(weight, config, block_sizes)
        _same_bytes(ours, plain)


def test_a_transposed_half_weight_is_bounded_as_its_copy():
    """A slice along the input axis (matmul's y) is a strided view: its bits are read as they lie."""
    weight = half_weights_with_special_blocks((96, 64), seed=3).T[:, 16:48]
    config = SYMMETRIC[1]
    with np.errstate(invalid="ignore"):
        _same_bytes(spec_linear._quantize_blockwise(weight, config, [16, 1]),
                    plain_quantize(np.ascontiguousarray(weight), config, [16, 1]))


ELEMENTS = 1 << 18  # 1 MB of float32: mapped on its own, below a transparent huge page


FAULTS = """
import json, resource, sys
import numpy as np
from edgebuild_coreml.memory import freed_blocks_kept, map_large_blocks


def faults_of_repeated_temporaries(steps=24, elements=%d):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        scratch = np.ones(elements, np.float32)  # every page written
        del scratch
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


map_large_blocks()  # as the lower stage leaves the process: every such block its own mapping
mapped = faults_of_repeated_temporaries()
with freed_blocks_kept():
    kept = faults_of_repeated_temporaries()
after = faults_of_repeated_temporaries()
print(json.dumps([mapped, kept, after]))
""" % ELEMENTS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and page-fault counts")
def test_freed_blocks_kept_reuses_memory_instead_of_faulting_it_in_again():
    # a fresh process: the allocator's thresholds move with what the process freed before
    done = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    mapped, kept, after = json.loads(done.stdout.strip().splitlines()[-1])
    pages = ELEMENTS * 4 // resource.getpagesize()
    assert mapped >= 20 * pages  # each step faults its pages in anew
    assert kept <= 3 * pages  # the first step's pages, then reused
    assert after >= 20 * pages  # the block's setting ends with it
