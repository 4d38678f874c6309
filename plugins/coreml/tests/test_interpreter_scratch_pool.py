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
