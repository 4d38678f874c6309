"""Scratch buffers outlive the thread that made them (``_scratch``'s pool): a later thread takes
a whole set over, and threads alive at once never share one."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from edgebuild_coreml.interpreter import _scratch
from edgebuild_coreml.interpreter._scratch import scratch


def _in_thread(fn):
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


@pytest.fixture
def empty_pool(monkeypatch):
    monkeypatch.setattr(_scratch, "_pool", [])
    return _scratch._pool


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_a_thread_takes_over_the_buffers_of_one_that_ended(empty_pool, dtype):
    first = _in_thread(lambda: scratch("pooled", (64, 32), dtype))
    assert len(empty_pool) == 1
    later = _in_thread(lambda: scratch("pooled", (16, 8), dtype))
    assert np.shares_memory(first, later)
    assert len(empty_pool) == 1  # handed back when that thread ended in turn


def test_threads_alive_at_once_never_share_a_buffer(empty_pool):
    _in_thread(lambda: scratch("pooled", (256,), np.float32))  # one set in the pool
    ready, release, got = threading.Barrier(4), threading.Event(), []

    def hold():
        got.append(scratch("pooled", (256,), np.float32))
        ready.wait()
        release.wait()  # alive while the others ask

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=30)  # every thread holds its buffer now
    release.set()
    for thread in threads:
        thread.join()
    assert len(got) == 3
    assert not any(np.shares_memory(a, b) for i, a in enumerate(got) for b in got[i + 1:])


def test_the_pool_keeps_a_bounded_number_of_sets(empty_pool):
    release = threading.Event()

    def hold():
        scratch("pooled", (8,), np.float32)
        release.wait()

    threads = [threading.Thread(target=hold) for _ in range(_scratch.POOLED_SETS + 3)]
    for thread in threads:
        thread.start()
    release.set()
    for thread in threads:
        thread.join()
    assert len(empty_pool) == _scratch.POOLED_SETS


def test_a_buffer_past_the_kept_size_is_not_pooled(empty_pool):
    large = (_scratch.KEPT_BYTES // 4 + 1,)
    _in_thread(lambda: scratch("large", large, np.float32))
    assert all("large" not in buffers for buffers in empty_pool)


def test_a_lease_hands_its_buffers_to_the_next_lease_in_any_thread(empty_pool):
    with _scratch.lease():
        first = scratch("leased", (32, 32), np.float32)
    assert len(empty_pool) == 1  # handed back at the block's end, the thread still alive

    def later():
        with _scratch.lease():
            return scratch("leased", (32, 32), np.float32)

    assert np.shares_memory(first, _in_thread(later))


def test_a_lease_inside_another_keeps_the_outer_set(empty_pool):
    with _scratch.lease():
        outer = scratch("leased", (8,), np.float32)
        with _scratch.lease():
            inner = scratch("leased", (8,), np.float32)
        assert not empty_pool  # still the outer block's
    assert np.shares_memory(outer, inner) and len(empty_pool) == 1


def test_leases_held_at_once_never_share_a_buffer(empty_pool):
    with _scratch.lease():
        scratch("leased", (256,), np.float32)  # one warm set in the pool
    ready, release, got = threading.Barrier(4), threading.Event(), []

    def hold():
        with _scratch.lease():
            got.append(scratch("leased", (256,), np.float32))
            ready.wait(timeout=30)
            release.wait(timeout=30)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=30)
    release.set()
    for thread in threads:
        thread.join()
    assert len(got) == 3
    assert not any(np.shares_memory(a, b) for i, a in enumerate(got) for b in got[i + 1:])


@pytest.mark.parametrize("channels, size, kernel", [(8, (12, 10), 3), (16, (5, 7), 5)])
def test_programs_run_from_several_threads_give_each_sample_its_own_values(empty_pool, channels, size, kernel):
    """A depthwise conv net (scratch buffers) run from fresh threads, several at once and one
    after another, gives what one thread gives."""
    from concurrent.futures import ThreadPoolExecutor

    ct = pytest.importorskip("coremltools")
    from coremltools.converters.mil import Builder as mb
    from edgebuild_coreml.interpreter.executor import run_program_samples
    from interpreter_programs import spec

    rng = np.random.default_rng(channels)
    weight = rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32)

    @mb.program(input_specs=[spec((1, channels, *size))], opset_version=ct.target.iOS17)
    def prog(x):
        return mb.conv(x=x, weight=weight, groups=channels, pad_type="same", name="out")

    samples = [{"x": rng.standard_normal((1, channels, *size)).astype(np.float32)} for _ in range(8)]
    alone = [run_program_samples(prog, [sample])[0]["out"] for sample in samples]
    for _ in range(2):  # each round's threads are new, as each validation's are
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda chunk: run_program_samples(prog, chunk), [samples[:3], samples[3:5], samples[5:]]))
        flat = [one["out"] for chunk in got for one in chunk]
        for value, expected in zip(flat, alone):
            np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6)
