"""The interpreter on a saved package, callable with ONNX-named inputs, in this process or in
worker processes that each load the package once.

The interpreter spends most of a small model's time in Python between numpy calls (per-op
dispatch), holding the GIL: two threads running samples take turns on it, so only processes
put both cores to work. Workers start from a forkserver (forking a process that runs threads,
progress bars or a Dask worker's, is unsafe) that imports the interpreter once, and never import
the caller's main module (``edgebuild.worker_processes``); each worker then
reads the package and keeps its plan (expanded weights included) for every sample it runs,
with BLAS and torch's kernels (``torch_kernels``, where torch is installed) on one thread.

Starting them costs seconds (a fresh interpreter importing coremltools' reader and torch),
more than most validations' samples take. So samples run in the build's process first, and
workers are started in the background only once those samples have taken as long as a start
costs (``WORKER_START_SECONDS``: the rent-or-buy rule, never worse than twice the better of
the two choices made in hindsight); the build's process goes on running samples until they are
ready. ``$EDGEBUILD_VALIDATE_WORKERS`` set starts them at once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from edgebuild.plugin import BuildError, EdgebuildError


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
        self.artifact = Path(artifact)
        self.emulate_fp16 = emulate_fp16
        self.to_mil = dict((lowered or {}).get("renamed_inputs", {}))
        self.to_onnx = {mil: onnx for onnx, mil in (lowered or {}).get("renamed_outputs", {}).items()}
        self.program = shared_program(self.artifact)

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_many([inputs])[0]

    def run_many(self, samples: list[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """``[self(sample) for sample in samples]``, each op run on every sample before the next
        (``run_program_samples``)."""
        from . import ort_kernels, torch_kernels
        from .executor import run_program_samples

        # torch's kernels here too, on one thread, or onnxruntime's convolutions (see for_calls)
        with torch_kernels.for_calls(), ort_kernels.for_calls():
            outputs = run_program_samples(self.program, [{self.to_mil.get(k, k): v for k, v in sample.items()}
                                                         for sample in samples], fp16=self.emulate_fp16)
        return [{self.to_onnx.get(k, k): v for k, v in one.items()} for one in outputs]

    @property
    def samples_per_call(self) -> int:
        """How many samples a ``run_many`` call should take: up to ``SAMPLES_PER_CALL``, as many
        as keep the values they make within ``CALL_ELEMENTS`` (a large net gains nothing from
        several at once: its time is in its kernels)."""
        return samples_per_call(self.program, self._declared_elements)

    @functools.cached_property
    def _declared_elements(self) -> int | None:
        """``declared_elements`` of the program, read once: through coremltools' types it cost a
        small net's validation about a sample's time, twice per validation."""
        return declared_elements(self.program)

    @contextlib.contextmanager
    def samples_in_parallel(self, workers: int, samples: int | None = None
                            ) -> Iterator[tuple[Callable[[Mapping[str, np.ndarray]], dict], int]]:
        """``(run, workers)`` for ``edgebuild.dag.validate.sample_runner``: calls of ``run`` (from
        up to ``workers`` threads) run here until the ``samples`` still to come would take long
        enough here to pay for starting workers (``_LocalFirst``), then in ``workers`` processes
        started meanwhile, BLAS on one thread in each (``_LocalFirst``;
        with ``$EDGEBUILD_VALIDATE_WORKERS`` set, in the processes from the first call); they are
        stopped on leaving, killed if the block raised (an error or an interrupt). A program whose whole activations are small (an RNN cell over a short
        frame) runs one sample at a time here: shipping its samples to a process, or taking
        turns on the GIL with another thread, costs more than it computes. Its BLAS calls run
        on one thread meanwhile, as a worker's do: its matrices are small, and a BLAS pool
        waiting on a busy second core made a small program's matmul ten times slower. A
        daemonic process (a Dask worker's) may start no processes: it runs them one at a time too."""
        from edgebuild.plugin import blas_threads, can_start_workers, requested_sample_workers

        if workers <= 1:
            yield self, 1
            return
        elements = activation_elements(self.program, elements=self._declared_elements)
        if elements < PROCESS_MIN_ELEMENTS or not can_start_workers():
            with blas_threads(1):
                yield self, 1
            return
        if requested_sample_workers() is not None:  # asked for: workers from the start
            with self.in_processes(workers) as run:
                yield run, workers
            return
        local = _LocalFirst(self, lambda: self.in_processes(workers), samples=samples)
        try:
            yield local, workers
        except BaseException:
            local.close(kill=True)
            raise
        local.close(kill=False)

    @contextlib.contextmanager
    def in_processes(self, workers: int) -> Iterator[_WorkerPool]:
        """A runner whose calls run in ``workers`` processes (see ``samples_in_parallel``)."""
        from edgebuild.plugin import worker_context

        # never the caller's __main__ again: a script calling edgebuild.build() needs no main guard
        context = worker_context(preload=_preload())
        pool = _WorkerPool(context, workers, (str(self.artifact), self.emulate_fp16, self.to_mil, self.to_onnx),
                           samples_per_call=self.samples_per_call)
        try:
            yield pool
        except BaseException:
            pool.kill()
            raise
        else:
            pool.stop()


_UNKNOWN = object()  # declared elements not worked out yet

#: programs the runners have read, kept for the next runner on the same package (the fp16
#: emulation's, the next validation in ``edgebuild watch``): reading one back costs a small conv
#: net a third of a second, and its plan (constants conformed, calls prepared) is kept with it.
#: The last few are kept, and only those of packages up to ``SHARED_PACKAGE_BYTES``: a plan
#: holds expanded weights.
SHARED_PROGRAMS = 2
SHARED_PACKAGE_BYTES = 256 << 20
_programs: collections.OrderedDict = collections.OrderedDict()
_programs_lock = threading.Lock()


def shared_program(artifact: Path):
    """The pymil Program of the package at ``artifact``: read, or the one a runner read before
    from the same files (same paths, inodes, sizes and times: a rebuilt package is read again).
    Runners only run it; whoever edits a program reads its own (``executor.load_mlpackage``)."""
    from .executor import load_mlpackage

    key, size = _package_identity(artifact)
    with _programs_lock:
        program = _programs.get(key)
        if program is not None:
            _programs.move_to_end(key)
            return program
    program = load_mlpackage(artifact)
    if key is not None and size <= SHARED_PACKAGE_BYTES:
        with _programs_lock:
            _programs[key] = program
            while len(_programs) > SHARED_PROGRAMS:
                _programs.popitem(last=False)
    return program


def _package_identity(artifact: Path) -> tuple[tuple | None, int]:
    """(what identifies the package's files now, their bytes); None for a path not there (the
    read reports it). A package's ``Manifest.json`` is left out: coremltools writes it anew on
    every read, and the model and its weights are what the program is read from."""
    try:
        root = artifact.resolve(strict=True)
        files = sorted(root.rglob("*")) if root.is_dir() else [root]
        stats = [(str(file.relative_to(root)), file.stat()) for file in files
                 if file.is_file() and not (file.parent == root and file.name == "Manifest.json")]
    except OSError:
        return None, 0
    identity = tuple((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in stats)
    return (str(root), identity), sum(st.st_size for _, st in stats)


#: most samples one call runs (``ArtifactRunner.run_many``): a small conv net ran 25% faster per
#: sample with 8 at once than one at a time, 20% with 4
SAMPLES_PER_CALL = 8
#: values (elements) the samples of one call may produce between them, all of them counted as if
#: held at once (an upper bound: most are freed after their last reader)
CALL_ELEMENTS = 32_000_000


def samples_per_call(program, elements=_UNKNOWN) -> int:
    """See ``ArtifactRunner.samples_per_call``; one for a program of run-time shapes.
    ``elements``: its ``declared_elements`` when known."""
    elements = declared_elements(program) if elements is _UNKNOWN else elements
    return 1 if elements is None else max(1, min(SAMPLES_PER_CALL, CALL_ELEMENTS // max(elements, 1)))


#: values (elements) a program's ops produce per sample below which samples run one at a time
#: in the build's process (silero_vad's 35 ops make 0.16M; the conv nets and MiniLM 2M to 25M)
PROCESS_MIN_ELEMENTS = 1_000_000


def activation_elements(program, function: str = "main", elements=_UNKNOWN) -> int:
    """Elements of every value ``function``'s ops (constants aside) produce, by declared shape;
    a symbolic dimension counts as large, so a program of run-time shapes runs in processes.
    ``elements``: its ``declared_elements`` when known."""
    elements = declared_elements(program, function) if elements is _UNKNOWN else elements
    return PROCESS_MIN_ELEMENTS if elements is None else elements


def declared_elements(program, function: str = "main") -> int | None:
    """Elements of every value ``function``'s ops (constants aside) produce, by declared shape;
    None if any has a symbolic dimension."""
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
                return None
            total += int(np.prod(declared[1], dtype=np.int64))
    return total


#: what starting the worker processes is taken to cost (a forkserver importing the interpreter,
#: coremltools' reader and torch, then each worker reading the package)
WORKER_START_SECONDS = 1.0


class _LocalFirst:
    """Samples in the build's process, until those still to come would take long enough here that
    running them in worker processes pays for starting those (the time they would save, half of
    it with two workers, exceeds ``WORKER_START_SECONDS``); the workers (``start()``, a context
    manager giving a ``_WorkerPool``) then start in the background while samples go on here, and
    take the calls once up. Not told how many samples are coming, it starts them once the samples
    here have taken as long as a start (rent or buy: never worse than twice the better choice
    made in hindsight). One call runs here at a time (Python between the interpreter's kernels
    takes turns on the GIL anyway). Closing never waits for a start under way: the starting
    thread stops the pool itself once it is up."""

    def __init__(self, local: ArtifactRunner, start: Callable[[], contextlib.AbstractContextManager], *,
                 samples: int | None = None):
        self._local = local
        self._start = start
        self.samples_per_call = local.samples_per_call
        self._state = threading.Condition()
        self._busy = False  # a call is running here
        self._pool: _WorkerPool | None = None
        self._starter: threading.Thread | None = None
        self._closed = threading.Event()
        self._spent = 0.0  # seconds the calls here have taken
        self._done = 0  # samples they ran
        self._coming = samples  # samples not yet run, when told

    def _workers_pay(self) -> bool:
        if self._coming is None:
            return self._spent >= WORKER_START_SECONDS
        per_sample = self._spent / max(self._done, 1)
        return per_sample * max(self._coming, 0) / 2 > WORKER_START_SECONDS

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict:
        return self.run_many([inputs])[0]

    def run_many(self, samples: list[Mapping[str, np.ndarray]]) -> list[dict]:
        with self._state:
            while self._busy and self._pool is None:
                self._state.wait()
            pool = self._pool
            self._busy = pool is None
        if pool is not None:
            return pool.run_many(samples)
        start = time.perf_counter()
        try:
            return self._local.run_many(samples)
        finally:
            with self._state:
                self._busy = False
                self._spent += time.perf_counter() - start
                self._done += len(samples)
                if self._coming is not None:
                    self._coming -= len(samples)
                if self._starter is None and not self._closed.is_set() and self._workers_pay():
                    self._starter = threading.Thread(target=self._serve_pool, name="edgebuild-workers", daemon=True)
                    self._starter.start()
                self._state.notify_all()

    def _serve_pool(self) -> None:
        """The pool's life: started, offered to the calls, stopped once the runner is closed."""
        try:
            with self._start() as pool:
                with self._state:
                    if not self._closed.is_set():
                        self._pool = pool
                    self._state.notify_all()
                self._closed.wait()
        except Exception:  # noqa: BLE001, S110 - no workers: the samples go on running here
            pass

    def close(self, *, kill: bool) -> None:
        """No more calls: the workers leave (are killed when ``kill``), now or once started."""
        with self._state:
            self._closed.set()
            pool = self._pool
        if pool is not None:
            if kill:
                pool.kill()
            self._starter.join()  # the pool's stop: its workers finish their last replies


class _WorkerPool:
    """``workers`` processes, each serving samples over a duplex pipe of its own: a call takes an
    idle worker's connection (from any thread), sends the sample, waits for its reply and hands
    the connection back. concurrent.futures' process pool moves a sample through queues and a
    feeder thread: a 600 KB input costs ~3 ms a round trip there, ~0.1 ms over a socket pair,
    which for a small conv net is the difference between the IPC and the math."""

    def __init__(self, context, workers: int, setup: tuple, *, samples_per_call: int = 1):
        self._artifact = Path(setup[0])
        self.samples_per_call = samples_per_call  # see ArtifactRunner.samples_per_call
        self._processes: list = []
        self._connections: list = []
        self._idle: queue.SimpleQueue = queue.SimpleQueue()  # idle connections; None once one died
        self._broken = False
        try:
            for index in range(workers):
                here, there = context.Pipe(duplex=True)
                process = context.Process(target=_serve, args=(there, *setup), daemon=True,
                                          name=f"edgebuild-interpreter-{index}")
                process.start()
                there.close()  # the worker's end lives on in the worker alone: its death reads as EOF here
                self._processes.append(process)
                self._connections.append(here)
            for connection in self._connections:  # each says when it has read and planned the package
                try:
                    connection.recv_bytes()
                except (EOFError, OSError):
                    raise self._died() from None
                self._idle.put(connection)
        except BaseException:
            self.kill()
            raise

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict:
        return self.run_many([inputs])[0]

    def run_many(self, samples: list[Mapping[str, np.ndarray]]) -> list[dict]:
        """The outputs of ``samples``, run in one worker (``ArtifactRunner.run_many``)."""
        request = pickle.dumps([dict(sample) for sample in samples], protocol=5)
        connection = self._idle.get()
        if connection is None or self._broken:
            self._idle.put(connection)  # wakes the next caller, which fails alike
            raise self._died()
        try:
            connection.send_bytes(request)
            reply = connection.recv_bytes()
        except (EOFError, OSError):
            self._broken = True
            self._idle.put(None)
            raise self._died() from None
        self._idle.put(connection)
        kind, value = pickle.loads(reply)
        if kind == "error":
            error_type, message, hint = value
            raise error_type(message, hint=hint)
        if kind == "raise":
            error, remote_traceback = value
            raise error from _WorkerTraceback(remote_traceback)
        return value

    def _died(self) -> BuildError:
        return BuildError(f"an interpreter worker process running {self._artifact.name} died (out of memory?)",
                          hint="set EDGEBUILD_VALIDATE_WORKERS=1 to run validation samples one at a time "
                               "in the build's own process")

    def stop(self) -> None:
        """Let every worker finish: each leaves when its connection closes."""
        for connection in self._connections:
            connection.close()
        for process in self._processes:
            process.join(timeout=STOP_SECONDS)
        self.kill()  # any that did not leave in time

    def kill(self) -> None:
        """Stop every worker now, whatever it runs."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(timeout=5)
        for connection in self._connections:
            connection.close()


STOP_SECONDS = 60  # a worker still busy this long after the pool is left is terminated
READY = b"ready"  # a worker's first message: set up (or failed to, which each sample's reply then says)


class _WorkerTraceback(Exception):
    """The traceback of an unexpected error in a worker, as text: the cause of the error raised here."""


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
    _warm(runner.program, emulate_fp16)
    _worker = runner


def _warm(program, emulate_fp16: bool) -> None:
    """Run ``program`` once on zeros, when its inputs have static shapes, so that its plan, its
    compiled closures, its constants' template and each op's cached geometry are made at the
    worker's start rather than in the first sample it is sent. Zeros are not a valid input for
    every model: an error here is left for a real sample to meet. Only a straight-line program
    is warmed (one the compiled plan runs): a loop whose trip count comes from the input could
    run on zeros for as long as it likes."""
    from .compiled import CompiledFunction
    from .executor import run_program
    from .plan import tensor_type_of

    if not CompiledFunction.eligible(program.functions["main"]):
        return
    zeros = {}
    for name, var in program.functions["main"].inputs.items():
        declared = tensor_type_of(var)
        if declared is None or not all(isinstance(d, (int, np.integer)) for d in declared[1]):
            return
        zeros[name] = np.zeros(tuple(int(d) for d in declared[1]), declared[0])
    try:
        run_program(program, zeros, fp16=emulate_fp16)
    except Exception:  # noqa: BLE001, S110 - see above
        pass


def _serve(connection, artifact: str, emulate_fp16: bool, to_mil: dict, to_onnx: dict) -> None:
    """A worker's life: set up, then answer each sample on ``connection`` until it closes. A
    setup that failed answers every sample with its error."""
    failed = None
    try:
        _start_worker(artifact, emulate_fp16, to_mil, to_onnx)
    except Exception as exc:  # noqa: BLE001 - crosses back as each sample's error
        failed = _failure(exc)
    try:
        connection.send_bytes(READY)
        while True:
            try:
                request = connection.recv_bytes()
            except EOFError:  # the pool was left
                return
            reply = failed or _run_in_worker(pickle.loads(request))
            connection.send_bytes(_pickled(reply))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the build process reports it
        return


def _run_in_worker(samples: list[dict]) -> tuple[str, object]:
    """``("ok", [outputs of each sample])``, ``("error", (type, message, hint))``: an edgebuild
    error crosses back whole (its hint would be lost in pickling the exception itself), or
    ``("raise", (error, traceback text))`` for any other."""
    try:
        return "ok", _worker.run_many(samples)
    except Exception as exc:  # noqa: BLE001 - crosses back to the caller
        return _failure(exc)


def _failure(exc: Exception) -> tuple[str, object]:
    if isinstance(exc, EdgebuildError):
        return "error", (type(exc), exc.message, exc.hint)
    return "raise", (exc, "".join(traceback.format_exception(exc)))


def _pickled(reply: tuple) -> bytes:
    try:
        return pickle.dumps(reply, protocol=5)
    except Exception:  # noqa: BLE001 - an error object that does not pickle crosses as text
        kind, value = reply
        if kind != "raise":
            raise
        error, text = value
        return pickle.dumps(("raise", (RuntimeError(f"{type(error).__name__}: {error}"), text)), protocol=5)
