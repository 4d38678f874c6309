"""The interpreter on a saved package, callable with ONNX-named inputs, in this process or in
worker processes that each load the package once.

The interpreter spends most of a small model's time in Python between numpy calls (per-op
dispatch), holding the GIL: two threads running samples take turns on it, so only processes
put both cores to work. Workers start from a forkserver (forking a process that runs threads,
progress bars or a Dask worker's, is unsafe) that imports the interpreter once; each worker then
reads the package and keeps its plan (expanded weights included) for every sample it runs,
with BLAS and torch's kernels (``torch_kernels``, where torch is installed) on one thread.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from edgebuild.errors import BuildError, EdgebuildError


def _preload() -> list[str]:
    """Modules the forkserver imports once, so each worker starts with the interpreter (and
    coremltools' package reader, seconds to import) in memory."""
    import importlib.util
    import pkgutil

    package = __name__.rpartition(".")[0]
    ops = [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(Path(__file__).parent)])
           if m.name.startswith("ops_")]
    torch = ["torch"] if importlib.util.find_spec("torch") is not None else []  # imported, not run: safe to fork
    return [__name__, f"{package}.executor", "coremltools.converters.mil.frontend.milproto.load", *ops, *torch]


class ArtifactRunner:
    """``runner(inputs) -> outputs`` by ONNX names, on the package at ``artifact``.

    ``lowered`` is the lower stage's info, for inputs and outputs whose ONNX names were not valid
    MIL names; ``emulate_fp16`` rounds fp32 intermediates through fp16 (``run_program(fp16=)``).
    """

    def __init__(self, artifact: str | os.PathLike, *, emulate_fp16: bool = False, lowered: dict | None = None):
        from .executor import load_mlpackage

        self.artifact = Path(artifact)
        self.emulate_fp16 = emulate_fp16
        self.to_mil = dict((lowered or {}).get("renamed_inputs", {}))
        self.to_onnx = {mil: onnx for onnx, mil in (lowered or {}).get("renamed_outputs", {}).items()}
        self.program = load_mlpackage(self.artifact)

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .executor import run_program

        outputs = run_program(self.program, {self.to_mil.get(k, k): v for k, v in inputs.items()},
                              fp16=self.emulate_fp16)
        return {self.to_onnx.get(k, k): v for k, v in outputs.items()}

    @contextlib.contextmanager
    def samples_in_parallel(self, workers: int) -> Iterator[tuple[Callable[[Mapping[str, np.ndarray]], dict], int]]:
        """``(run, workers)`` for ``edgebuild.dag.validate.sample_runner``: each call of ``run``
        (from up to ``workers`` threads) runs in one of ``workers`` processes, BLAS on one thread
        in each; they are stopped on leaving, killed if the block raised (an error or an
        interrupt). A program whose whole activations are small (an RNN cell over a short
        frame) runs one sample at a time here: shipping its samples to a process, or taking
        turns on the GIL with another thread, costs more than it computes."""
        if workers <= 1 or activation_elements(self.program) < PROCESS_MIN_ELEMENTS:
            yield self, 1
            return
        with self.in_processes(workers) as run:
            yield run, workers

    @contextlib.contextmanager
    def in_processes(self, workers: int) -> Iterator[Callable[[Mapping[str, np.ndarray]], dict]]:
        """A runner whose calls run in ``workers`` processes (see ``samples_in_parallel``)."""
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_preload())
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                   initargs=(str(self.artifact), self.emulate_fp16, self.to_mil, self.to_onnx))
        try:
            yield lambda inputs: _result(pool.submit(_run_in_worker, dict(inputs)), self.artifact)
        except BaseException:
            _kill(pool)
            raise
        else:
            pool.shutdown(wait=True)


#: values (elements) a program's ops produce per sample below which samples run one at a time
#: in the build's process (silero_vad's 35 ops make 0.16M; the conv nets and MiniLM 2M to 25M)
PROCESS_MIN_ELEMENTS = 1_000_000


def activation_elements(program, function: str = "main") -> int:
    """Elements of every value ``function``'s ops (constants aside) produce, by declared shape;
    a symbolic dimension counts as large, so a program of run-time shapes runs in processes."""
    from .plan import decompresses, is_constant_op, tensor_type_of

    total = 0
    for op in program.functions[function].operations:
        if is_constant_op(op) or decompresses(op):
            continue
        for out in op.outputs:
            declared = tensor_type_of(out)
            if declared is None:
                continue
            if not all(isinstance(d, (int, np.integer)) for d in declared[1]):
                return PROCESS_MIN_ELEMENTS
            total += int(np.prod(declared[1], dtype=np.int64))
    return total


def _result(future, artifact: Path) -> dict:
    try:
        kind, value = future.result()
    except BrokenProcessPool:
        raise BuildError(f"an interpreter worker process running {artifact.name} died (out of memory?)",
                         hint="set EDGEBUILD_VALIDATE_WORKERS=1 to run validation samples one at a time "
                              "in the build's own process") from None
    if kind == "error":
        error_type, message, hint = value
        raise error_type(message, hint=hint)
    return value


def _kill(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: queued samples cancelled, running workers terminated."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)


# -- in the worker process -------------------------------------------------------------------

_worker: ArtifactRunner | None = None
_blas_limit = None  # kept alive: the limit holds while the object does


def _start_worker(artifact: str, emulate_fp16: bool, to_mil: dict, to_onnx: dict) -> None:
    global _worker, _blas_limit
    from edgebuild.plugin import blas_threads

    _blas_limit = blas_threads(1)  # the other worker has the other core
    from . import torch_kernels

    # torch's casts and convolutions where it is installed, on this worker's one core; not in the
    # build's process, whose torch (a PyTorch source's reference) keeps its own thread pool
    torch_kernels.enable(threads=1)
    runner = ArtifactRunner.__new__(ArtifactRunner)
    runner.artifact, runner.emulate_fp16, runner.to_mil, runner.to_onnx = Path(artifact), emulate_fp16, to_mil, to_onnx
    from .executor import load_mlpackage

    runner.program = load_mlpackage(runner.artifact)
    _worker = runner


def _run_in_worker(inputs: dict) -> tuple[str, object]:
    """``("ok", outputs)`` or ``("error", (type, message, hint))``: an edgebuild error crosses
    back whole (its hint would be lost in pickling the exception itself)."""
    try:
        return "ok", _worker(inputs)
    except EdgebuildError as exc:
        return "error", (type(exc), exc.message, exc.hint)
