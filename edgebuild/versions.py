"""The version a cache key names for edgebuild and for each plugin distribution.

A release's version names its code. A working copy's does not: an editable install (or a
package on ``PYTHONPATH``) changes under one version while it is worked on, and a key naming
only the version would hand back results built by code that is gone. For a package imported
from outside the interpreter's site-packages the key version therefore also carries a digest of
its files, as a PEP 440 local label (``0.1.0+src.1a2b3c4d5e6f``).

Standard library only: the up-to-date check reads :func:`watched_paths` before anything else loads.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import site
import sysconfig
from pathlib import Path

DIGEST_CHARS = 12
_watched: dict[str, None] = {}  # files and directories whose sources went into a key version


def _installed_roots() -> list[Path]:
    """Where installed (released) packages live for this interpreter."""
    roots = {sysconfig.get_paths().get(key) for key in ("purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # some virtualenv flavours lack these
        pass
    return [Path(root).resolve() for root in roots if root]


@functools.cache
def is_working_copy(package: str) -> bool:
    """Whether ``package`` is imported from outside site-packages: its code may change in place."""
    dirs = package_dirs(package)
    roots = _installed_roots()
    return bool(dirs) and not all(any(d.resolve().is_relative_to(r) for r in roots) for d in dirs)


def package_dirs(package: str) -> list[Path]:
    """Where the top-level ``package`` is imported from (none if it cannot be found)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def _files(root: Path) -> tuple[list[Path], list[Path]]:
    """Every file and directory under ``root``, bytecode caches left out, in a stable order."""
    files, dirs = [], [root]
    for current, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
        dirs.extend(Path(current, d) for d in subdirs)
        files.extend(Path(current, n) for n in sorted(names) if not n.endswith((".pyc", ".pyo")))
    return files, dirs


@functools.cache
def source_digest(package: str) -> str:
    """sha256 over the relative paths and contents of the files of ``package``."""
    digest = hashlib.sha256()
    for root in package_dirs(package):
        files, dirs = _files(root)
        for path in files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            try:
                digest.update(path.read_bytes())
            except OSError as exc:  # unreadable: its name and the reason still count
                digest.update(type(exc).__name__.encode())
            _watched[str(path)] = None
        _watched.update((str(d), None) for d in dirs)
    return digest.hexdigest()[:DIGEST_CHARS]


def key_version(version: str, package: str) -> str:
    """``version``, plus the source digest of ``package`` when it is a working copy."""
    if not is_working_copy(package):
        return version
    return f"{version}+src.{source_digest(package)}"


@functools.cache
def edgebuild_version() -> str:
    from edgebuild._version import __version__

    return key_version(__version__, "edgebuild")


def watched_paths() -> list[str]:
    """The files and directories whose contents some key version of this process depends on."""
    return list(_watched)


@functools.cache
def _installed_version(distribution: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def library_versions(distributions) -> dict[str, str]:
    """The installed version of each of ``distributions`` (those not installed are left out): what a
    stage's key names of the libraries that produce or judge its output."""
    found = {name: _installed_version(name) for name in distributions}
    return {name: version for name, version in sorted(found.items()) if version is not None}
