"""Atomic writes: build beside the destination under a temporary name, then rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb"):
    """Yield a file object; ``path`` appears only if the block finishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_file(path, "w") as handle:
        handle.write(text)


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Yield a temporary directory that replaces ``path`` (file or dir) when the block finishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        replace_path(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_path(new: Path, path: Path) -> None:
    """Move ``new`` to ``path``, swapping out whatever was there (directories cannot be os.replace'd over)."""
    if path.is_dir() and not path.is_symlink():
        trash = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, trash)
        os.replace(new, path)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, path)
