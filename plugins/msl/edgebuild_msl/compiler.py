"""Compile a translated kernel with the host C++ compiler; binaries are cached by content.

The cache key covers the translation unit, every emulation header, the flags and the
compiler's version, so an edit to any of them rebuilds and nothing stale is ever run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from edgebuild_msl.errors import KernelError

EMULATION_DIR = Path(__file__).parent / "emulation"
FLAGS = ("-std=c++20", "-O1", "-pthread", "-w")
TSAN_FLAGS = ("-fsanitize=thread", "-g")


def cache_dir() -> Path:
    """``$EDGEBUILD_MSL_CACHE``, else ``msl-kernels`` in edgebuild's cache directory."""
    if os.environ.get("EDGEBUILD_MSL_CACHE"):
        return Path(os.environ["EDGEBUILD_MSL_CACHE"])
    if os.environ.get("EDGEBUILD_CACHE_DIR"):
        return Path(os.environ["EDGEBUILD_CACHE_DIR"]) / "msl-kernels"
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild")) / "msl-kernels"


def compiler() -> str:
    found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not found:
        raise KernelError("no C++ compiler found to emulate Metal kernels on this machine",
                          hint="install g++ (12 or newer) or clang++, or set CXX")
    return found


@lru_cache(maxsize=None)
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def _headers_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(EMULATION_DIR.iterdir()):
        if path.suffix == ".h" or path.name == "metal_stdlib":
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compile_translation_unit(code: str, *, label: str, tsan: bool = False) -> Path:
    """The path of an executable built from ``code`` (reused when already in the cache)."""
    cxx = compiler()
    flags = FLAGS + (TSAN_FLAGS if tsan else ())
    key = hashlib.sha256("\0".join([code, _headers_digest(), " ".join(flags), _compiler_version(cxx)]).encode()).hexdigest()
    target = cache_dir() / f"{key[:32]}{'-tsan' if tsan else ''}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    include = precompiled_headers(cxx, flags) or EMULATION_DIR
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        source = Path(work) / "kernel.cpp"
        source.write_text(code)
        built = Path(work) / "kernel"
        done = subprocess.run([cxx, *flags, "-I", str(include), str(source), "-o", str(built)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KernelError(f"kernel {label} does not compile against the MSL emulation:\n{_first_errors(done.stderr)}",
                              hint="an unknown function or type is outside the emulated subset (docs/msl.md)")
        os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target


def precompiled_headers(cxx: str, flags: tuple[str, ...]) -> Path | None:
    """A directory holding the emulation headers and ``msl.h.gch`` for ``flags``, built once.

    The header is most of a kernel's compile time; precompiled, a kernel builds in a fraction
    of it. None (compile from source) when the compiler cannot precompile."""
    key = hashlib.sha256("\0".join([_headers_digest(), " ".join(flags), _compiler_version(cxx)]).encode()).hexdigest()
    target = cache_dir() / f"pch-{key[:24]}"
    if (target / "msl.h.gch").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        staged = Path(work) / "headers"
        shutil.copytree(EMULATION_DIR, staged, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        done = subprocess.run([cxx, *flags, "-x", "c++-header", str(staged / "msl.h"), "-o", str(staged / "msl.h.gch")],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        try:
            os.replace(staged, target)
        except OSError:  # another process won the race; its copy is identical
            pass
    return target if (target / "msl.h.gch").exists() else None


def _first_errors(stderr: str, limit: int = 12) -> str:
    lines = [line for line in stderr.splitlines() if "error" in line or line.startswith(" ")]
    return "\n".join(lines[:limit]) or stderr[-2000:]
