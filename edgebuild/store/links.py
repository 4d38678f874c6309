"""Put a store file into an output directory without copying gigabytes: a hard link to a sealed
(read-only) file, else a reflink, else a copy. And put a source's weight file into a store entry
the same way: a reference (a symbolic link) to it when it is large (``refer``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

from edgebuild.store.local import seal


def link_or_copy(src, dst) -> None:
    """Hard-link a store file into the output directory (no copy of gigabytes of weights) once it
    is read-only, so that editing the output in place cannot reach the store; if it cannot be made
    read-only, or across file systems, reflink where the file system can, else copy."""
    if seal(src):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    clone_or_copy(src, dst)


REFERENCE_MIN_BYTES = 64 << 20  # smaller source files are copied: the entry then stands alone


def refer(source, target) -> bool:
    """Make ``target`` (in a store entry being built) a symbolic link to the file ``source`` (a
    source model's weight file, or an earlier entry's reference to one) resolves to, when that
    file is at least ``REFERENCE_MIN_BYTES`` and lies outside ``target``'s folder; False, making
    nothing, otherwise.

    The entry then holds the source's bytes without a copy of them (4.4 GB for a 1.1B decoder in
    fp32: most of its import on a disk that writes 400 MB/s). Nothing is done to the file itself:
    ``seal`` never follows a link, so it is never made read-only or linked into an output. The
    store vouches for the link by the file's digest like for any other file (the source was hashed
    for the build's key, and the digest is remembered by the file's stat): if the file changes,
    every entry referring to it stops being intact and is rebuilt, never served."""
    real = os.path.realpath(source)
    entry = os.path.realpath(os.path.dirname(os.path.abspath(target)))
    if os.path.commonpath([real, entry]) == entry:
        return False  # a file of the entry being built (a scratch file the stage then removes)
    try:
        if not os.path.isfile(real) or os.path.getsize(real) < REFERENCE_MIN_BYTES:
            return False
        os.symlink(real, target)
    except OSError:  # a file system without symbolic links: copy
        return False
    return True


FICLONE = 0x40049409  # Linux ioctl: share the extents of another file (btrfs, XFS, ...)


COPY_CHUNK = 256 << 20  # bytes per system call of a copy that can be stopped
BUFFER_CHUNK = 16 << 20  # bytes per read of a copy through this process (no kernel file-to-file copy)


def clone_or_copy(src, dst, stop=None) -> bool:
    """Copy ``src`` to ``dst`` (its bytes and times): a clone where the file system shares
    extents (APFS, btrfs, XFS), else a kernel-side copy, else a copy through one reused buffer.
    ``stop`` (a ``threading.Event``) ends the copy at its next chunk once set; returns whether
    the copy is complete (``dst`` is then partial)."""
    if _clone(src, dst):
        shutil.copystat(src, dst)
        return True
    if stop is None:
        shutil.copy2(src, dst)
        return True
    with open(src, "rb") as source, open(dst, "wb") as target:
        size = os.fstat(source.fileno()).st_size
        complete = (_copy_in_kernel(source.fileno(), target.fileno(), size, stop) if _KERNEL_COPY is not None
                    else _copy_buffered(source, target, stop))
    if complete:
        shutil.copystat(src, dst)
    return complete


def _clone(src, dst) -> bool:
    """A copy-on-write clone of ``src`` at ``dst``: macOS's clonefile(2) (APFS), Linux's FICLONE
    ioctl (btrfs, XFS); False where the file system or platform has neither."""
    if sys.platform == "darwin":
        return _clonefile(src, dst)
    try:
        import fcntl

        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        return True
    except (ImportError, OSError):
        return False


def _clonefile(src, dst) -> bool:
    import ctypes

    try:
        clonefile = ctypes.CDLL(None, use_errno=True).clonefile
    except (OSError, AttributeError):
        return False
    clonefile.argtypes, clonefile.restype = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32), ctypes.c_int
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dst)  # clonefile makes its target; it refuses one that exists
    return clonefile(os.fsencode(os.fspath(src)), os.fsencode(os.fspath(dst)), 0) == 0


# Linux's sendfile copies between two files in the kernel (across file systems too, unlike
# copy_file_range); macOS's and the BSDs' write only to sockets, so there the bytes pass through
# this process.
_KERNEL_COPY = getattr(os, "sendfile", None) if sys.platform.startswith("linux") else None


def _copy_in_kernel(source: int, target: int, size: int, stop) -> bool:
    offset = 0
    while offset < size:
        if stop.is_set():
            return False
        sent = _KERNEL_COPY(target, source, offset, min(COPY_CHUNK, size - offset))
        if sent == 0:
            break  # the source shrank: what it holds now was copied
        offset += sent
    return True


def _copy_buffered(source, target, stop) -> bool:
    buffer = memoryview(bytearray(BUFFER_CHUNK))
    while True:
        if stop.is_set():
            return False
        read = source.readinto(buffer)
        if not read:
            return True
        target.write(buffer[:read])
