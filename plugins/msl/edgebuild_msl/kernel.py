"""``compile_kernel`` / ``CompiledKernel.run`` / ``check_kernel``: a declared kernel, run on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgebuild_msl.compiler import compile_translation_unit
from edgebuild_msl.errors import KernelError, KernelRace
from edgebuild_msl.scan import scan_unsupported
from edgebuild_msl.signature import KernelSignature, check_signature
from edgebuild_msl.spec import KernelSpec, call_sizing
from edgebuild_msl.translate import translation_unit

FAILURE_EXIT = 86  # msl.h's eb::fail
TSAN_EXIT = 66
RUN_TIMEOUT_S = float(os.environ.get("EDGEBUILD_MSL_TIMEOUT", "600"))


@dataclass
class CompiledKernel:
    """A kernel built for the CPU emulation (``tsan``: with ThreadSanitizer)."""

    spec: KernelSpec
    signature: KernelSignature
    executable: Path
    tsan: bool = False

    def run(self, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Dispatch the kernel over ``inputs``; returns its outputs by name."""
        spec = self.spec
        attrs = spec.attrs_with_defaults(attrs)
        arrays = {t.name: self._input(t, inputs) for t in spec.inputs}
        shapes = {name: tuple(a.shape) for name, a in arrays.items()}
        out_shapes = {k: tuple(int(d) for d in v) for k, v in call_sizing(spec.output_shapes, shapes, attrs).items()}
        grid, group = spec.dispatch_size(shapes, attrs)
        if any(g == 0 for g in group) or group[0] * group[1] * group[2] > 1024:
            raise KernelError(f"kernel {spec.entry!r}: threadgroup size {group} must be 1..1024 threads")
        with tempfile.TemporaryDirectory(prefix="edgebuild-msl-") as work:
            argv = [str(self.executable), *map(str, grid), *map(str, group)]
            outputs = {}
            for param in self.signature.parameters:
                if param.attribute == "threadgroup":
                    size = int(call_sizing(spec.threadgroup_memory[param.index], shapes, attrs))
                    argv.append(f"t:{size}")
                elif param.attribute == "buffer":
                    argv.append(self._buffer_arg(param.index, arrays, shapes, attrs, out_shapes, outputs, Path(work)))
            self._execute(argv)
            return {name: np.fromfile(path, dtype=dtype).reshape(shape) for name, (path, dtype, shape) in outputs.items()}

    # -- helpers ------------------------------------------------------------------------------
    def _input(self, decl, inputs) -> np.ndarray:
        if decl.name not in inputs:
            raise KernelError(f"kernel {self.spec.entry!r}: input {decl.name!r} is missing")
        array = np.asarray(inputs[decl.name])
        if array.dtype != decl.numpy_dtype:
            raise KernelError(f"kernel {self.spec.entry!r}: input {decl.name!r} is {array.dtype}, declared {decl.dtype}")
        if decl.rank is not None and array.ndim != decl.rank:
            raise KernelError(f"kernel {self.spec.entry!r}: input {decl.name!r} has rank {array.ndim}, declared {decl.rank}")
        return np.ascontiguousarray(array)

    def _buffer_arg(self, index, arrays, shapes, attrs, out_shapes, outputs, work: Path) -> str:
        spec = self.spec
        name = next((n for n, i in spec.buffers.items() if i == index), None)
        path = work / f"buffer{index}.bin"
        if name in arrays:
            arrays[name].tofile(path)
            return f"r:{path}"
        if name is not None:  # an output
            decl = next(t for t in spec.outputs if t.name == name)
            shape = out_shapes[name]
            outputs[name] = (path, decl.numpy_dtype, shape)
            return f"w:{int(np.prod(shape, dtype=np.int64)) * decl.numpy_dtype.itemsize}:{path}"
        binding = next(c for c in spec.constants if c.index == index)
        binding.evaluate(shapes, attrs).tofile(path)
        return f"r:{path}"

    def _execute(self, argv: list[str]) -> None:
        env = dict(os.environ)
        if self.tsan:
            env["TSAN_OPTIONS"] = f"exitcode={TSAN_EXIT} halt_on_error=1 report_signal_unsafe=0"
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise KernelError(f"kernel {self.spec.entry!r} ran longer than {RUN_TIMEOUT_S:.0f} s on the CPU emulation",
                              hint="try smaller inputs, or raise EDGEBUILD_MSL_TIMEOUT") from None
        if "ThreadSanitizer: data race" in done.stderr:
            raise KernelRace(f"kernel {self.spec.entry!r} has a data race:\n{race_summary(done.stderr)}",
                             hint="a threadgroup_barrier(mem_flags::mem_threadgroup) is probably missing between "
                                  "the writes and reads of threadgroup memory")
        if done.returncode != 0:
            message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
            if done.returncode == FAILURE_EXIT:
                message = done.stderr.strip().removeprefix("msl emulation: ")
            raise KernelError(f"kernel {self.spec.entry!r} failed on the CPU emulation: {message}")


def race_summary(report: str) -> str:
    """ThreadSanitizer's SUMMARY line and the two racing accesses, each at its kernel line."""
    lines = report.splitlines()
    summary = next((line.strip() for line in lines if line.startswith("SUMMARY: ThreadSanitizer")), "")
    summary = re.sub(r"\s+in\s+\S.*$", "", re.sub(r"\S*/([^/\s]+\.metal:\d+)", r"\1", summary))
    accesses = []
    for i, line in enumerate(lines):
        access = re.match(r"\s*((?:Previous )?(?:atomic )?(?:[Ww]rite|[Rr]ead) of size \d+) at \S+ by (thread T\d+|main thread)", line)
        if access:
            frame = next((re.search(r"([^/\s]+\.metal:\d+)", f) for f in lines[i + 1:i + 6] if ".metal:" in f), None)
            accesses.append(f"{access.group(1)} by {access.group(2)} at {frame.group(1) if frame else '?'}")
    return "\n".join([summary, *accesses[:2]]).strip() or "\n".join(lines[:12])


def compile_kernel(spec: KernelSpec, *, tsan: bool = False) -> CompiledKernel:
    """Check ``spec``'s kernel (subset scan, signature) and build it for the CPU emulation."""
    source = spec.source_text()
    label = f"{spec.entry!r} ({spec.qualified_name})"
    scan_unsupported(source, kernel_label=label)
    sig = check_signature(spec, source)
    code = translation_unit(source, sig, name=spec.source_name(), workers=max(1, min(4, os.cpu_count() or 1)))
    return CompiledKernel(spec, sig, compile_translation_unit(code, label=label, tsan=tsan), tsan)


def check_kernel(spec: KernelSpec, inputs: Mapping[str, np.ndarray], attrs: Mapping[str, Any] | None = None,
                 *, tsan: bool = False) -> float:
    """Max absolute difference between the emulated kernel's outputs and the numpy reference.

    A NaN where the reference has none (an element the kernel never wrote reads as NaN)
    counts as an infinite error."""
    produced = compile_kernel(spec, tsan=tsan).run(inputs, attrs)
    expected = spec.run_reference(inputs, attrs)
    worst = 0.0
    for name, want in expected.items():
        got = produced[name]
        if got.shape != want.shape:
            raise KernelError(f"kernel {spec.entry!r}: output {name!r} has shape {got.shape}, the reference {want.shape}")
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        diff = np.where(np.isnan(got.astype(np.float64)) & ~np.isnan(want.astype(np.float64)), np.inf, diff)
        worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
    return worst
