"""Atomic writes: build beside the destination under a temporary name, then rename.

``tempfile`` makes its files 0600 and directories 0700; what edgebuild publishes gets the
modes a plain ``open``/``mkdir`` would give under the user's umask instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

_umask: int | None = None
_umask_lock = threading.Lock()


def umask() -> int:
    """The process umask (read once: reading it means setting it, which is not thread-safe)."""
    global _umask
    with _umask_lock:
        if _umask is None:
            _umask = os.umask(0o022)
            os.umask(_umask)
        return _umask


def file_mode(*, writable: bool = True) -> int:
    return (0o666 if writable else 0o444) & ~umask()


def dir_mode() -> int:
    return 0o777 & ~umask()


def publish_tree(root: Path) -> None:
    """Give ``root`` and the directories below it the usual directory mode (files are left alone:
    some are hard links to read-only store files, whose mode and ctime must not change)."""
    os.chmod(root, dir_mode())
    for folder, dirs, _ in os.walk(root):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, dir_mode())


def make_temp_dir(parent: Path, prefix: str, suffix: str = "") -> Path:
    """A new directory in ``parent`` with the usual mode (``mkdtemp`` makes it 0700)."""
    path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix, suffix=suffix))
    os.chmod(path, dir_mode())
    return path


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb"):
    """Yield a file object; ``path`` appears only if the block finishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
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
    tmp = make_temp_dir(path.parent, f".{path.name}.", ".tmp")
    try:
        yield tmp
        replace_path(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_path(new: Path, path: Path) -> None:
    """Move ``new`` to ``path``, swapping out whatever was there (directories cannot be os.replace'd
    over). Renames never follow a symlink, and ``rmtree`` does not descend into one."""
    if path.is_dir() and not path.is_symlink():
        trash = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, trash)
        os.replace(new, path)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, path)
