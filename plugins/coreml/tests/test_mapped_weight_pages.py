"""Resident pages of weights viewing onnx_ir's read-only maps are dropped without reading /proc."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from edgebuild import mapped_pages
from edgebuild_coreml.memory import drop_mapped_pages, views_read_only_mmap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise: Linux")


def test_a_view_of_a_read_only_map_is_dropped_without_a_look_at_proc(tmp_path, monkeypatch):
    values = np.arange(4 * mapped_pages.MIN_BYTES // 4, dtype=np.float32).reshape(1024, -1)
    values.tofile(tmp_path / "w.bin")
    with open(tmp_path / "w.bin", "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    weight = np.frombuffer(mapped, dtype=np.float32).reshape(values.shape).T  # a lowered weight's view
    assert views_read_only_mmap(weight)
    monkeypatch.setattr(mapped_pages, "_file_mappings", lambda: pytest.fail("read /proc"))
    assert float(weight.sum()) == pytest.approx(float(values.sum()))
    assert drop_mapped_pages([weight]) >= mapped_pages.MIN_BYTES
    np.testing.assert_array_equal(weight, values.T)  # read back from the file


def test_other_memory_is_not_taken_for_a_read_only_map(tmp_path):
    anonymous = mmap.mmap(-1, mapped_pages.MIN_BYTES)
    assert not views_read_only_mmap(np.frombuffer(anonymous, dtype=np.uint8))
    (tmp_path / "w.bin").write_bytes(bytes(mapped_pages.MIN_BYTES))
    with open(tmp_path / "w.bin", "r+b") as handle:
        writable = mmap.mmap(handle.fileno(), 0)
    assert not views_read_only_mmap(np.frombuffer(writable, dtype=np.uint8))
    assert not views_read_only_mmap(np.zeros(8))
