"""macOS: compile a kernel to a ``.metallib`` with Apple's toolchain (``xcrun metal`` / ``metallib``).

Only available where ``xcrun`` is (a Mac with Xcode or its command line tools); everywhere
else :func:`metal_toolchain_available` is False and :func:`build_metallib` refuses clearly.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from edgebuild_msl.errors import KernelError
from edgebuild_msl.signature import check_signature
from edgebuild_msl.spec import KernelSpec


def metal_toolchain_available() -> bool:
    return platform.system() == "Darwin" and shutil.which("xcrun") is not None


def build_metallib(spec: KernelSpec, out_path: Path, *, std: str = "metal3.0", debug: bool = False) -> Path:
    """Check the signature, then ``metal -c`` to AIR and ``metallib`` to ``out_path``."""
    if not metal_toolchain_available():
        raise KernelError(f"kernel {spec.entry!r}: building a .metallib needs macOS with Xcode (xcrun metal)",
                          hint="on Linux the kernel is checked with the CPU emulation instead (compile_kernel)")
    check_signature(spec)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / spec.source_name()
        source.write_text(spec.source_text())
        air = Path(work) / "kernel.air"
        compile_cmd = ["xcrun", "-sdk", "macosx", "metal", f"-std={std}", "-c", str(source), "-o", str(air)]
        if debug:
            compile_cmd.insert(-4, "-gline-tables-only")
        _run(compile_cmd, spec, "metal")
        _run(["xcrun", "-sdk", "macosx", "metallib", str(air), "-o", str(out_path)], spec, "metallib")
    return out_path


def _run(cmd: list[str], spec: KernelSpec, tool: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KernelError(f"kernel {spec.entry!r}: xcrun {tool} failed:\n{done.stderr.strip()[-3000:]}")
