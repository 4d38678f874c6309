"""Runs the stages of every variant on the workers of a Dask cluster (``--executor dask://HOST:PORT``).

The client plans every variant's stages first, as one graph of distinct stages: stages of two
variants with the same name, parameters, plugins and inputs would get the same key, so they are
one task (the local executor's claims, decided before anything runs). It submits a stage once
its inputs are built, with their Results as its arguments, longest remaining chain first, and
the scheduler gives it to the least busy worker (see ``DaskExecutor._dispatch`` for why not as
Dask dependencies).

Stage bodies are closures and do not travel: a task carries the variant (plain data) and the
stage's name, and the worker rebuilds that variant's pipeline with its own registry. Workers
build through the store they are given (the client's store directory, shared on one machine,
and a remote cache when one is configured: :func:`remote_cache`); the client gets back
Results (key, digest, path, info), never the files.

A worker killed mid-stage leaves at most a store temporary (an entry is published by one
rename, see ``Store.build``) and the scheduler runs the task again on another worker. Ctrl-C on
the client cancels every task; a stage body already running on a worker finishes there
(Dask cannot interrupt a thread) and its entry serves the next run.

A lost scheduler fails the run instead of leaving the client waiting: a closed connection at
once (Dask drops the client's tasks when it closes), a scheduler that stops answering (a
frozen process, a network cut, where no connection closes) after ``EDGEBUILD_DASK_TIMEOUT``
seconds without an answer to a ping (:class:`SchedulerWatch`). Every variant not built by then
fails with a message naming the scheduler.

``distributed`` is imported only here, and only when a dask executor runs.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable

from edgebuild import progress
from edgebuild.dag.executor import Executor, Job
from edgebuild.dag.keys import canonical
from edgebuild.dag.stages import Result, Stage
from edgebuild.versions import edgebuild_version
from edgebuild.errors import BuildError, EdgebuildError, UsageError
from edgebuild.store.local import Store

SCHEME = "dask://"
CONNECT_SECONDS = 10
# A task whose worker died is rescheduled by the scheduler itself (``distributed.scheduler.
# allowed-failures``); ``retries`` covers an exception raised outside the stage body (a worker
# that cannot open the store, say). A stage's own error comes back as a value, not retried.
RETRIES = 2
PROGRESS_SECONDS = 0.2  # a worker sends a stage's sub-step counts at most this often
TIMEOUT_ENV = "EDGEBUILD_DASK_TIMEOUT"
LOST_SECONDS = 60.0  # a scheduler silent this long is lost (a busy one answers a ping within seconds)
PING_SECONDS = 5.0  # how often the client asks the scheduler whether it is there (at most)
POLL_SECONDS = 0.02  # how often the client looks for finished stages (and at the watch)
CLOSE_SECONDS = 5  # closing a client of a lost scheduler waits no longer than this


def scheduler_address(spec: str) -> str:
    """``dask://HOST:PORT`` as the scheduler's ``tcp://HOST:PORT``."""
    host, sep, port = spec[len(SCHEME):].rpartition(":")
    if not spec.startswith(SCHEME) or not sep or not host or not port.isdigit():
        raise UsageError(f"--executor {spec!r}: expected `local` or `dask://HOST:PORT`",
                         hint="e.g. --executor dask://127.0.0.1:8786 (`make cluster` starts a scheduler there)")
    return f"tcp://{host}:{port}"


@dataclass(frozen=True)
class StageTask:
    """What a worker needs to build one stage."""

    label: str  # the first variant using it, for progress lines
    variant: object  # edgebuild.recipe.Variant
    stage: str
    deps: tuple[str, ...]
    plugins: dict  # the client's versions of the plugins and libraries in the key, checked on the worker
    edgebuild: str  # the client's edgebuild key version (a working copy's carries its source digest)
    cache_dir: str
    force: bool
    topic: str  # where the worker sends this run's progress events
    remote: object = None  # the remote cache's settings, when one is configured


@dataclass
class Failed:
    """A stage's EdgebuildError as a value: handed past dependents to the client, never retried.

    Kept as class, message and attributes because an EdgebuildError's keyword arguments (hint)
    do not survive pickling."""

    kind: type
    message: str
    state: dict

    @classmethod
    def of(cls, exc: EdgebuildError) -> "Failed":
        return cls(type(exc), exc.message, dict(vars(exc)))

    def error(self) -> EdgebuildError:
        exc = self.kind.__new__(self.kind)
        Exception.__init__(exc, self.message)
        exc.__dict__.update(self.state)
        return exc


# -- the worker side ---------------------------------------------------------------------


def build_on_worker(task: StageTask, *inputs):
    """The Dask task: build ``task.stage`` from its inputs' Results; a Result or a Failed."""
    failed = next((i for i in inputs if isinstance(i, Failed)), None)
    if failed is not None:
        return failed
    try:
        return _build(task, dict(zip(task.deps, inputs)))
    except EdgebuildError as exc:
        return Failed.of(exc)
    except Exception as exc:  # worded as the local executor words it
        return Failed.of(BuildError(f"stage {task.stage} failed: {type(exc).__name__}: {exc}"))


def _build(task: StageTask, inputs: dict[str, Result]) -> Result:
    from edgebuild.dag.source_stage import source_resolver
    from edgebuild.dag.stages import pipeline
    from edgebuild.registry import get_registry
    from edgebuild.store.location import open_store

    store = open_store(task.cache_dir)
    registry = get_registry()
    stages = pipeline(task.variant, registry, source_resolver(task.variant, registry, store))
    stage = next(s for s in stages if s.name == task.stage)
    send = _sender(task)
    send("start", None)
    if stage.resolve is not None:
        return stage.resolve()
    mine = {"edgebuild": edgebuild_version(), **stage.plugins, **stage.libraries_versions}
    theirs = {"edgebuild": task.edgebuild, **task.plugins}
    if mine != theirs:  # the keys would differ from the client's: same recipe, other entries
        raise BuildError(f"stage {task.stage}: the worker runs {_versions(mine)}, the client {_versions(theirs)}",
                         hint="install the same edgebuild and plugins on every worker, and restart the workers "
                              "after changing a working copy (a worker reads its code's digest once)")
    remote = remote_cache(store, task.remote)
    inputs = {name: localised(result, store, remote, stages[0]) for name, result in inputs.items()}
    executor = Executor(store, force=task.force)
    executor.remote = remote  # pulls a missing entry before building, pushes what it built
    with progress.reporting(lambda step, done, total: send("progress", (step, done, total))):
        return executor.build_one(stage, inputs)


def _versions(versions: dict) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def remote_cache(store: Store, settings):
    """The remote cache a worker pulls missing inputs from and pushes its results to (and the
    client pulls the entries it materialises from): an object with ``pull(key) -> bool`` and
    ``push(key)``, or None without a remote (``settings`` None)."""
    from edgebuild.store.remote_policy import open_remote

    return open_remote(store, settings, warn=lambda text: print(f"warning: {text}", file=sys.stderr))


def localised(result: Result, store: Store, remote, resolve: Stage) -> Result:
    """``result`` with a path on this machine: another machine's store entry is taken from the
    local store or pulled from the remote, another machine's source resolved here again."""
    if result.path.exists():
        return result
    if result.name == "resolve":
        return resolve.resolve()  # downloaded into this machine's store, checked against the recipe's sha256
    entry = store.lookup(result.key)
    if entry is None and remote is not None and remote.pull(result.key):
        entry = store.lookup(result.key)
    if entry is None:
        raise BuildError(f"stage {result.name}: entry {result.key[:12]} is not in the store at {store.root}",
                         hint="workers on other machines share entries through a remote cache (cache.remote)")
    return replace(result, path=entry.out)


def _sender(task: StageTask) -> Callable[[str, object], None]:
    """Send this stage's events to the client (progress at most every PROGRESS_SECONDS, but
    the STARTED sub-step and a finished count always)."""
    from distributed import get_worker

    worker = get_worker()
    last = [0.0]

    def send(what: str, payload) -> None:
        now = time.monotonic()
        if what == "progress":
            step, done, total = payload
            if step != progress.STARTED and done != total and now - last[0] < PROGRESS_SECONDS:
                return
            last[0] = now
        worker.log_event(task.topic, {"label": task.label, "stage": task.stage, "what": what, "payload": payload})

    return send


# -- the client side ---------------------------------------------------------------------


def connect(address: str):
    """A client of the scheduler at ``address``, which has at least one worker; exit 1 otherwise."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--executor dask:// needs Dask's distributed package, which is not installed",
                         hint="pip install 'edgebuild[dask]'") from None
    hint = "start one with `make cluster` (or `dask scheduler` and `dask worker`), or correct HOST:PORT"
    try:
        client = Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise BuildError(f"cannot reach the Dask scheduler at {address}: {exc}", hint=hint) from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_SECONDS)
    except (OSError, TimeoutError):
        client.close()
        raise BuildError(f"the Dask scheduler at {address} has no workers", hint=hint) from None
    return client


def lost_after() -> float:
    """``$EDGEBUILD_DASK_TIMEOUT``: seconds without an answer from the scheduler before the run fails."""
    configured = os.environ.get(TIMEOUT_ENV, "").strip()
    if not configured:
        return LOST_SECONDS
    try:
        seconds = float(configured)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{TIMEOUT_ENV}={configured!r}: expected a number of seconds above 0",
                         hint=f"e.g. {TIMEOUT_ENV}=60 (the default), or unset it")
    return seconds


class SchedulerLost(Exception):
    """The client can no longer reach the scheduler; ``error`` is what every unbuilt variant reports."""

    def __init__(self, error: BuildError):
        super().__init__(error.message)
        self.error = error


class SchedulerWatch:
    """Tells the dispatch loop when the scheduler is gone.

    A closed connection shows in the client's status. A frozen scheduler (or a cut network) closes
    nothing, and the client's futures would wait forever: a thread pings the scheduler every few
    seconds and ``check`` fails once none has been answered for ``seconds``. The ping runs on its
    own thread so a slow answer never holds up dispatch."""

    def __init__(self, client, address: str, seconds: float):
        self.client = client
        self.address = address
        self.seconds = seconds
        self.answered = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ping, name="edgebuild-scheduler-watch", daemon=True)

    def __enter__(self) -> "SchedulerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _ping(self) -> None:
        interval = min(PING_SECONDS, self.seconds / 3)
        while not self._stop.wait(interval):
            try:
                self.client.sync(self.client.scheduler.identity, callback_timeout=self.seconds)
            except Exception:  # refused, timed out, or the client closed: not an answer
                continue
            self.answered = time.monotonic()

    def check(self) -> None:
        """Raise SchedulerLost when the connection closed or the scheduler has been silent too long."""
        if self.client.status not in ("running", "newly-created"):
            self.lost("the connection to it closed, and Dask drops a client's tasks when it does")
        silent = time.monotonic() - self.answered
        if silent > self.seconds:
            self.lost(f"it has not answered for {silent:.0f} s ({TIMEOUT_ENV}={self.seconds:g})")

    def lost(self, why: str):
        raise SchedulerLost(BuildError(
            f"lost the Dask scheduler at {self.address}: {why}",
            hint="check that the scheduler and its workers are running (`make cluster`, or `dask scheduler` and "
                 "`dask worker`), then run the build again: the stages built so far are in the store and are "
                 f"not built again. {TIMEOUT_ENV} sets how long a silent scheduler is waited for"))


def close(client, *, quiet: bool) -> None:
    """Close ``client`` within CLOSE_SECONDS. ``quiet``: its scheduler is lost, and the run has said so
    once; Dask would log the reconnection it gives up as an error with a traceback."""
    import logging

    loggers = [logging.getLogger(name) for name in ("distributed.client", "distributed.utils")] if quiet else []
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        client.close(timeout=CLOSE_SECONDS)
    except Exception:  # a lost scheduler may not see the client off; the run's outcome stands
        pass
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def plan_key(stage: Stage, variant, deps: dict[str, str]) -> str:
    """What makes two variants' stages one task: the cache key's parts, with inputs named by
    their own plan keys (their digests are not known yet). A local source is named with its folder."""
    if stage.resolve is not None:
        model = variant.recipe.source.model
        local = ":" not in model or model.startswith("file:")
        what = {"resolve": stage.key_params(), "base_dir": str(variant.base_dir) if local else None}
    else:
        what = {"stage": stage.name, "params": stage.key_params(), "plugins": stage.plugins,
                "libraries": stage.libraries_versions, "inputs": deps}
    return hashlib.sha256(canonical(what).encode()).hexdigest()


@dataclass
class _Use:
    job: Job
    stage: str
    owner: bool  # the first variant using the task; the others report it "cached", as locally


@dataclass
class _Node:
    """One distinct stage of the run: a task once its inputs are built."""

    task: StageTask
    name: str  # its Dask key
    deps: list[str]  # its inputs' plan keys, in the stage's order
    priority: int
    uses: list[_Use] = field(default_factory=list)
    dependents: list[str] = field(default_factory=list)
    waiting: int = 0  # inputs not built yet
    outcome: object = None  # a Result or a Failed, once built


class DaskExecutor:
    """The executor interface of :class:`Executor` (``run(jobs)`` fills results and errors) on a cluster."""

    def __init__(self, address: str, store: Store, *, variants: dict, force: bool = False,
                 on_event: Callable[[str, str, Result | None], None] | None = None, remote=None):
        self.address = address
        self.store = store
        self.variants = variants  # job label -> Variant
        self.force = force
        self.remote = remote  # the remote cache's settings, handed to the workers
        self._remote = remote_cache(store, remote)
        self.on_event = on_event or (lambda *a: None)
        self.lost_after = lost_after()  # read before connecting: a bad value is a usage error
        self._finished: set[tuple[str, str]] = set()  # (label, stage): late progress is dropped
        self._lost = False  # the scheduler went away during the run
        self._lock = threading.Lock()

    def run(self, jobs: list[Job]) -> list[Job]:
        client = connect(self.address)
        topic = f"edgebuild-{uuid.uuid4().hex}"
        try:
            client.subscribe_topic(topic, self._on_worker_event)
            self._dispatch(client, self._graph(jobs, topic))
        finally:
            close(client, quiet=self._lost)
        return jobs

    def _graph(self, jobs: list[Job], topic: str) -> dict[str, _Node]:
        """Every distinct stage of the run by plan key, in dependency order."""
        plans = [self._plan(job) for job in jobs]
        # critical path first: a stage's priority is the most stages any variant still has to run
        # from it on, so the workers take the heads of long chains (lower, compress) before the
        # ends (package, validate) of others and neither waits for inputs near the end of the run
        priority: dict[str, int] = {}
        for job, planned in zip(jobs, plans):
            for i, stage in enumerate(job.stages):
                key = planned[stage.name]
                priority[key] = max(priority.get(key, 0), len(job.stages) - i)
        nodes: dict[str, _Node] = {}
        run_id = topic[-8:]
        for job, planned in zip(jobs, plans):
            shipped = self._shipped(job)
            for stage in job.stages:
                key = planned[stage.name]
                node = nodes.get(key)
                if node is None:
                    task = StageTask(job.label, shipped, stage.name, tuple(stage.deps),
                                     {**stage.plugins, **stage.libraries_versions},
                                     edgebuild_version(), str(self.store.root), self.force, topic, self.remote)
                    deps = [planned[d] for d in stage.deps]
                    node = nodes[key] = _Node(task, f"{stage.name}-{key[:16]}-{run_id}", deps, priority[key],
                                              waiting=len(set(deps)))
                    for dep in set(deps):
                        nodes[dep].dependents.append(key)
                node.uses.append(_Use(job, stage.name, owner=not node.uses))
        return nodes

    def _shipped(self, job: Job):
        """The job's variant as a worker gets it: its paths absolute (the workers' working
        directories are not the client's)."""
        variant = self.variants[job.label]
        return replace(variant, path=variant.path.absolute(), includes=[p.absolute() for p in variant.includes])

    def _plan(self, job: Job) -> dict[str, str]:
        """Each stage of the job -> its plan key."""
        shipped = self._shipped(job)
        planned: dict[str, str] = {}
        for stage in job.stages:
            planned[stage.name] = plan_key(stage, shipped, {d: planned[d] for d in stage.deps})
        return planned

    def _dispatch(self, client, nodes: dict[str, _Node]) -> None:
        """Submit each stage once its inputs are built, their Results as its arguments.

        Not as Dask dependencies: the scheduler places a task on the worker that holds its
        dependencies' results, and here those are records of a few hundred bytes (the files are
        in the store), so the fan-out after a shared stage (ten compressions of one lowered
        model) would queue on the one worker that built it. Without dependencies the scheduler
        gives each task to the least busy worker, highest priority first."""
        from distributed import as_completed

        by_name = {node.name: key for key, node in nodes.items()}
        submitted = []

        def submit(node: _Node):
            inputs = [nodes[d].outcome for d in node.deps]  # a Failed among them comes straight back
            future = client.submit(build_on_worker, node.task, *inputs, key=node.name, priority=node.priority,
                                   pure=False, retries=RETRIES)
            submitted.append(future)
            return future

        with SchedulerWatch(client, self.address, self.lost_after) as watch:
            try:
                try:
                    finished = as_completed([submit(node) for node in nodes.values() if not node.deps],
                                            loop=client.loop)
                except Exception:  # the client closed under us
                    watch.check()
                    raise
                self._collect(finished, nodes, by_name, submit, watch)
            except SchedulerLost as lost:
                self._lost = True
                self._fail_unbuilt(nodes, lost.error)
            except KeyboardInterrupt:
                client.cancel(submitted, force=True)
                raise

    def _collect(self, finished, nodes: dict[str, _Node], by_name: dict[str, str], submit, watch: SchedulerWatch) -> None:
        """Settle each stage as it finishes and submit the stages it completes the inputs of, until
        none is left; between results, ``watch`` fails the loop if the scheduler is lost."""
        while not finished.is_empty():
            batch = finished.next_batch(block=False)
            if not batch:
                watch.check()
                time.sleep(POLL_SECONDS)
                continue
            for future in batch:
                if future.cancelled():  # by us only on Ctrl-C; else Dask dropped it with the connection
                    watch.check()
                node = nodes[by_name[future.key]]
                node.outcome = self._outcome(future, node.task.stage)
                for use in node.uses:
                    self._settle(use, node.outcome)
                for key in node.dependents:
                    dependent = nodes[key]
                    dependent.waiting -= 1
                    if dependent.waiting == 0:
                        try:
                            finished.add(submit(dependent))
                        except Exception:  # the client closed under us
                            watch.check()
                            raise

    def _fail_unbuilt(self, nodes: dict[str, _Node], error: BuildError) -> None:
        """Every stage not built yet fails with ``error`` (the variants built before stay built)."""
        failed = Failed.of(error)
        for node in nodes.values():
            if node.outcome is None:
                node.outcome = failed
                for use in node.uses:
                    self._settle(use, failed)

    @staticmethod
    def _outcome(future, stage: str):
        try:
            return future.result()
        except Exception as exc:  # the task itself failed: a worker died too often, or the cluster went away
            return Failed.of(BuildError(f"stage {stage} failed on the cluster: {type(exc).__name__}: {exc}"))

    def _settle(self, use: _Use, outcome) -> None:
        job = use.job
        if isinstance(outcome, Failed):
            if job.error is None:  # the first failure of the chain; its dependents carry it on
                job.error = outcome.error()
            return
        result = outcome if use.owner else Result(use.stage, outcome.key, outcome.digest, outcome.path,
                                                  outcome.info, "cached", 0.0)
        result = localised(result, self.store, self._remote, next(s for s in job.stages if s.name == "resolve"))
        result = next(s for s in job.stages if s.name == use.stage).judged(result, job.results)
        job.results[use.stage] = result
        with self._lock:
            self._finished.add((job.label, use.stage))
        self.on_event(job.label, f"{use.stage}:done", result)

    def _on_worker_event(self, event) -> None:
        """A worker's ``start`` / ``progress`` event (on the client's event loop thread)."""
        _, message = event
        label, stage = message["label"], message["stage"]
        with self._lock:
            if (label, stage) in self._finished:
                return
        payload = progress.Step(*message["payload"]) if message["what"] == "progress" else None
        self.on_event(label, f"{stage}:{message['what']}", payload)
