"""Put a store file into an output directory without copying gigabytes: a hard link to a sealed
(read-only) file, else a reflink, else a copy."""

from __future__ import annotations

import os
import shutil

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


FICLONE = 0x40049409  # Linux ioctl: share the extents of another file (btrfs, XFS, ...)


COPY_CHUNK = 256 << 20  # bytes per system call of a copy that can be stopped


def clone_or_copy(src, dst, stop=None) -> bool:
    """Copy ``src`` to ``dst`` (its bytes and times): a reflink where the file system shares
    extents, else a kernel-side copy. ``stop`` (a ``threading.Event``) ends the copy at its next
    chunk once set; returns whether the copy is complete (``dst`` is then partial)."""
    try:
        import fcntl

        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        shutil.copystat(src, dst)
        return True
    except (ImportError, OSError):
        pass
    if stop is None or not hasattr(os, "sendfile"):
        shutil.copy2(src, dst)
        return True
    with open(src, "rb") as source, open(dst, "wb") as target:
        size, offset = os.fstat(source.fileno()).st_size, 0
        while offset < size:
            if stop.is_set():
                return False
            sent = os.sendfile(target.fileno(), source.fileno(), offset, min(COPY_CHUNK, size - offset))
            if sent == 0:
                break  # the source shrank: what it holds now was copied
            offset += sent
    shutil.copystat(src, dst)
    return True
