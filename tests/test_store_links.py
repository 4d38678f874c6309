"""clone_or_copy on every platform: a clone where the file system shares extents, else Linux's
kernel copy, else a copy through one buffer (macOS's and the BSDs' sendfile writes only to
sockets), each stoppable between chunks."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from edgebuild.store import links


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(5 * 4096 + 7))
    os.utime(path, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return path


@pytest.fixture(params=["kernel", "buffered"])
def copy_path(request, monkeypatch):
    """No clone (as on ext4), then the kernel copy (Linux) or the buffered one (elsewhere)."""
    monkeypatch.setattr(links, "_clone", lambda src, dst: False)
    if request.param == "kernel" and links._KERNEL_COPY is None:
        pytest.skip("no file-to-file kernel copy on this platform")
    if request.param == "buffered":
        monkeypatch.setattr(links, "_KERNEL_COPY", None)
    monkeypatch.setattr(links, "COPY_CHUNK", 4096)
    monkeypatch.setattr(links, "BUFFER_CHUNK", 4096)
    return request.param


def test_a_stoppable_copy_is_whole_with_the_sources_times(tmp_path, source, copy_path):
    target = tmp_path / "copy.bin"
    assert links.clone_or_copy(source, target, threading.Event()) is True
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_mtime_ns == source.stat().st_mtime_ns


def test_a_stopped_copy_says_so_and_is_short(tmp_path, source, copy_path):
    stop = threading.Event()
    stop.set()
    target = tmp_path / "stopped.bin"
    assert links.clone_or_copy(source, target, stop) is False
    assert target.stat().st_size < source.stat().st_size


def test_a_copy_replaces_what_the_target_held(tmp_path, source):
    target = tmp_path / "copy.bin"
    target.write_bytes(b"stale" * 10_000)
    assert links.clone_or_copy(source, target) is True
    assert target.read_bytes() == source.read_bytes()


@pytest.mark.skipif(sys.platform != "darwin", reason="clonefile(2) is macOS's")
def test_clonefile_clones_on_macos(tmp_path, source):
    target = tmp_path / "clone.bin"
    target.write_bytes(b"stale")
    if not links._clonefile(source, target):  # a volume that is not APFS
        pytest.skip("this volume cannot clone")
    assert target.read_bytes() == source.read_bytes()
