"""edgebuild.mapped_pages: resident pages of a file mapping are dropped, nothing else."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from edgebuild.mapped_pages import MIN_BYTES, drop_resident_ranges

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise on /proc mappings: Linux")


def test_a_read_mapping_is_dropped_and_reads_back_the_file(tmp_path):
    values = np.arange(4 * MIN_BYTES // 4, dtype=np.float32)
    values.tofile(tmp_path / "weights.bin")
    mapped = np.memmap(tmp_path / "weights.bin", dtype=np.float32, mode="r")
    assert float(mapped.sum()) == pytest.approx(float(values.sum()))  # every page read, resident
    advised = drop_resident_ranges([(mapped.ctypes.data, mapped.nbytes)])
    assert MIN_BYTES <= advised <= mapped.nbytes
    np.testing.assert_array_equal(mapped, values)  # faulted back in from the file


def test_anonymous_memory_and_small_ranges_are_left_alone():
    values = np.arange(4 * MIN_BYTES // 4, dtype=np.float32)
    assert drop_resident_ranges([(values.ctypes.data, values.nbytes)]) == 0
    np.testing.assert_array_equal(values[:3], [0, 1, 2])
    assert drop_resident_ranges([(values.ctypes.data, MIN_BYTES - 1)]) == 0


def test_file_offsets_locate_a_mapping_until_a_page_of_it_is_written(tmp_path):
    from edgebuild.mapped_pages import file_offsets

    values = np.arange(4 * MIN_BYTES // 4, dtype=np.float32)
    values.tofile(tmp_path / "weights.bin")
    assert file_offsets(tmp_path / "weights.bin") == []  # not mapped
    mapped = np.memmap(tmp_path / "weights.bin", dtype=np.float32, mode="c", offset=MIN_BYTES)
    float(mapped.sum())
    [(start, end, offset)] = file_offsets(tmp_path / "weights.bin")
    assert start <= mapped.ctypes.data < end
    assert offset + mapped.ctypes.data - start == MIN_BYTES  # the address of the file's byte MIN_BYTES
    mapped[0] = -1.0  # copy-on-write: the mapping no longer equals the file
    assert file_offsets(tmp_path / "weights.bin") is None
