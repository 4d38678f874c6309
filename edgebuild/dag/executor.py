"""Runs the stages of many variants: shared stages once, independent ones in parallel.

A stage's key depends on its inputs' digests, so keys are known only as upstream stages
finish. Each variant runs its chain in a worker thread; a stage key claimed by one
variant is awaited, not rebuilt, by the others (and across processes the store's file
locks do the same).

Ctrl-C stops every running stage body, in whichever thread it runs (see
:mod:`edgebuild.dag.interrupt`), and ``run`` then raises KeyboardInterrupt.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgebuild import progress
from edgebuild.collections_scope import older_objects_frozen
from edgebuild.dag.interrupt import Interrupts
from edgebuild.dag.keys import key_of
from edgebuild.stage import Result, Stage
from edgebuild.errors import BuildError, EdgebuildError
from edgebuild.store.local import Store

WAIT_SLICE_SECONDS = 0.2  # how late a Ctrl-C the kernel gave a worker thread is seen
_EXCLUSIVE: dict[str, threading.Lock] = {}  # see Executor._exclusive
_EXCLUSIVE_GUARD = threading.Lock()


@dataclass
class Job:
    """One variant's chain of stages."""

    label: str  # "recipe:variant"
    stages: list[Stage]
    results: dict[str, Result] = field(default_factory=dict)
    error: EdgebuildError | None = None


class Executor:
    def __init__(self, store: Store | None, *, jobs: int = 1, force: bool = False,
                 on_event: Callable[[str, str, Result | None], None] | None = None,
                 scratch: Path | None = None, remote=None):
        self.store = store  # None: --no-cache, build into temporaries
        # a shared cache behind the store (edgebuild.store.remote_policy.RemoteCache): pull(key) on a
        # local miss, push(key) after a build
        self.remote = remote
        # Read-only use of the store (``edgebuild plan``): entries are taken from it, misses are
        # built into temporaries under ``scratch`` (the caller removes it), nothing is written.
        self.scratch = scratch
        self.jobs = max(1, jobs)
        self.force = force
        self.on_event = on_event or (lambda *a: None)
        self._claims: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._forced: set[str] = set()
        self._interrupts = Interrupts()

    def key_of(self, stage: Stage, results: dict[str, Result]) -> str:
        return key_of(stage, {d: results[d].digest for d in stage.deps})

    def run(self, jobs: list[Job]) -> list[Job]:
        """Run every job; raises KeyboardInterrupt once its stages have stopped if Ctrl-C was pressed."""
        self._interrupts = Interrupts()
        with self._interrupts.watching():
            if self.jobs == 1 or len(jobs) == 1:
                for job in jobs:  # in this thread: the main thread's KeyboardInterrupt lands in the stage
                    self._run_job(job)
            else:
                self._run_in_threads(jobs)
        self._interrupts.check()  # an interrupt a stage body swallowed still ends the run
        return jobs

    def _run_in_threads(self, jobs: list[Job]) -> None:
        """Jobs on ``self.jobs`` daemon threads. On Ctrl-C the running stage bodies are interrupted
        (again every 0.1 s) and waited for, so each cleans up its store temporary; a second Ctrl-C
        abandons a thread stuck in a native call (its temporary goes with the next ``cache gc``)."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        for job in jobs:
            pending.put(job)
        failures: list[BaseException] = []

        def work(finished: threading.Event) -> None:
            try:
                while not self._interrupts.requested.is_set():
                    try:
                        job = pending.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        self._run_job(job)
                    except BaseException as exc:  # KeyboardInterrupt, or a bug: re-raised by the caller
                        failures.append(exc)
            finally:
                finished.set()

        # Waited for through events, not Thread.join: a join that Ctrl-C interrupts marks a thread
        # that is still running as stopped (CPython 3.11), and the next join would not wait.
        finished = [threading.Event() for _ in range(min(self.jobs, len(jobs)))]
        for i, event in enumerate(finished):
            threading.Thread(target=work, args=(event,), name=f"edgebuild-jobs-{i}", daemon=True).start()
        try:
            for event in finished:
                _wait_interruptibly(event)
        except KeyboardInterrupt:
            self._interrupts.request()
            for event in finished:  # a second Ctrl-C raises out of this wait
                _wait_interruptibly(event)
            raise
        errors = [exc for exc in failures if not isinstance(exc, KeyboardInterrupt)]
        if errors:
            raise errors[0]

    def _run_job(self, job: Job) -> None:
        try:
            for stage in job.stages:
                job.results[stage.name] = self._run_stage(job, stage)
        except EdgebuildError as exc:
            job.error = exc

    def _run_stage(self, job: Job, stage: Stage) -> Result:
        self._interrupts.check()
        if stage.resolve is not None:
            self.on_event(job.label, f"{stage.name}:start", None)
            with progress.reporting(self._progress_events(job.label, stage.name)), self._interrupts.stage_body():
                result = stage.resolve()  # (which reports STARTED when it downloads or hashes)
            self.on_event(job.label, f"{stage.name}:done", result)
            return result
        key = self.key_of(stage, job.results)
        with self._lock:
            claim = self._claims.get(key)
            owner = claim is None
            if owner:
                claim = self._claims[key] = Future()
        if not owner:
            shared = claim.result()  # raises the owner's error too
            result = stage.judged(Result(stage.name, key, shared.digest, shared.path, shared.info, "cached", 0.0),
                                  job.results)
            self.on_event(job.label, f"{stage.name}:done", result)
            return result
        try:
            self.on_event(job.label, f"{stage.name}:start", None)
            with progress.reporting(self._progress_events(job.label, stage.name)):
                result = self._build(stage, key, job.results)
            claim.set_result(result)  # as stored: each variant sharing it judges it itself
            result = stage.judged(result, job.results)
            self.on_event(job.label, f"{stage.name}:done", result)
            return result
        except BaseException as exc:
            claim.set_exception(exc if isinstance(exc, Exception) else BuildError("interrupted"))
            if isinstance(exc, EdgebuildError) or not isinstance(exc, Exception):
                raise
            raise BuildError(f"stage {stage.name} failed: {type(exc).__name__}: {exc}") from exc

    def build_one(self, stage: Stage, inputs: dict[str, Result]) -> Result:
        """Build one stage from its inputs' Results (or take it from the store), with no claims or
        events: what a worker of a distributed build runs (edgebuild.dag.dask_executor)."""
        return self._build(stage, self.key_of(stage, inputs), inputs)

    def _progress_events(self, label: str, stage: str) -> progress.Reporter:
        """A running stage's ``progress.report`` calls, as ``<stage>:progress`` events."""
        return lambda step, done, total: self.on_event(label, f"{stage}:progress", progress.Step(step, done, total))

    def _build(self, stage: Stage, key: str, results: dict[str, Result]) -> Result:
        inputs = {d: results[d] for d in stage.deps}
        start = time.perf_counter()
        if self.store is not None and self.scratch is not None:
            entry = self.store.lookup(key)
            if entry is not None:
                return Result(stage.name, key, entry.digest, entry.out, entry.info, "cached", 0.0)
        if self.store is None or self.scratch is not None:
            import tempfile

            out = Path(tempfile.mkdtemp(prefix=f"edgebuild-{stage.name}-", dir=self.scratch))
            try:
                info = self._produce(stage, inputs, out)
            except BaseException:
                import shutil

                shutil.rmtree(out, ignore_errors=True)  # nothing half-written left behind
                raise
            from edgebuild.store.local import manifest_digest, scan

            return Result(stage.name, key, manifest_digest(scan(out)), out, info, "ran",
                          round(time.perf_counter() - start, 3))
        if self.force:
            self.store.evict(key)
        pulled = False
        layout = stage.extra.get("layout")  # the files the stage produces: an entry holding others is refused
        if self.remote is not None and not self.force and self.store.lookup(key, layout) is None:
            with self._interrupts.stage_body():  # a download is stopped by Ctrl-C like a stage body
                pulled = self.remote.pull(key, layout)
        entry, built = self.store.build(key, stage.name, lambda out: self._produce(stage, inputs, out), layout)
        if built and self.remote is not None:
            with self._interrupts.stage_body():  # an upload stopped halfway stays invisible remotely
                self.remote.push(key)
        if not built:
            self.store.touch(entry)
        seconds = entry.meta.get("seconds", 0.0) if built else round(time.perf_counter() - start, 3)
        status = "ran" if built else "pulled" if pulled else "cached"
        return Result(stage.name, key, entry.digest, entry.out, entry.info, status, seconds)

    def _produce(self, stage: Stage, inputs: dict[str, Result], out: Path) -> dict:
        with self._exclusive(stage.extra.get("exclusive")), self._interrupts.stage_body(), \
                older_objects_frozen(collect_at_end=True):  # the body's collections skip the libraries
            return progress.announced(stage.run)(inputs, out)

    @contextmanager
    def _exclusive(self, group: str | None):
        """Stage bodies declaring the same ``extra["exclusive"]`` group (a library with global state,
        such as coremltools' MIL builder) never run at the same time in this process."""
        if group is None:
            yield
            return
        with _EXCLUSIVE_GUARD:
            lock = _EXCLUSIVE.setdefault(group, threading.Lock())
        while not lock.acquire(timeout=0.1):  # in steps, so Ctrl-C also ends the wait
            self._interrupts.check()
        try:
            yield
        finally:
            lock.release()


def _wait_interruptibly(event: threading.Event) -> None:
    """Wait in short slices: the kernel may hand a process's SIGINT to any of its threads, and
    Python runs the handler only when the main thread next executes bytecode, which a wait
    without a timeout never returns to."""
    while not event.wait(WAIT_SLICE_SECONDS):
        pass
