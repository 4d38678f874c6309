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


def clone_or_copy(src, dst) -> None:
    try:
        import fcntl

        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        shutil.copystat(src, dst)
        return
    except (ImportError, OSError):
        pass
    shutil.copy2(src, dst)
