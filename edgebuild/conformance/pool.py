"""Worker processes that run cases, each under a per-case timeout: one hang cannot stall the suite."""

from __future__ import annotations

import multiprocessing
import time
import traceback
from multiprocessing.connection import wait
from typing import Callable

from edgebuild.conformance.cases import Case
from edgebuild.conformance.runner import one_line, resolve_runner, run_case, warm_up
from edgebuild.errors import EdgebuildError


def _worker(conn, backend: str, runner: str | None) -> None:
    """Worker process: receive cases, send back records, until told to stop (None)."""
    try:
        run = resolve_runner(backend, runner).run
    except Exception as exc:  # noqa: BLE001
        conn.send({"status": "error", "reason": one_line(f"backend setup failed: {exc}")})
        return
    warm_up(run)
    try:
        conn.send("ready")
        while True:
            case = conn.recv()
            if case is None:
                return
            try:
                record = run_case(run, case)
            except Exception:  # noqa: BLE001
                record = {"status": "error", "reason": one_line(traceback.format_exc().splitlines()[-1])}
            conn.send(record)
    except (EOFError, OSError, KeyboardInterrupt):  # the parent went away: stop quietly
        return


class WorkerPool:
    """``jobs`` worker processes, each running one case at a time under a timeout; a worker
    that hangs or dies is replaced and its case is recorded as an error."""

    def __init__(self, jobs: int, backend: str, runner: str | None, timeout: float):
        self._context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        self._args, self._timeout = (backend, runner), timeout
        self._idle: list = []
        self._busy: dict = {}  # conn -> (case, started)
        self._procs: dict = {}
        self._starting: set = set()  # conns of workers not yet ready
        for _ in range(jobs):
            self._start()

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker, args=(child, *self._args), daemon=True)
        process.start()
        child.close()
        self._procs[parent] = process
        self._starting.add(parent)

    def _retire(self, conn) -> None:
        process = self._procs.pop(conn)
        process.kill()
        process.join()
        conn.close()

    def run(self, cases: list[Case], done: Callable[[Case, dict], None]) -> None:
        queue = list(reversed(cases))
        while queue or self._busy:
            while queue and self._idle:
                conn = self._idle.pop()
                case = queue.pop()
                conn.send(case)
                self._busy[conn] = (case, time.monotonic())
            ready = wait(list(self._busy) + list(self._starting), timeout=1.0)
            for conn in ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = None
                if conn in self._starting:
                    self._starting.discard(conn)
                    if message == "ready":
                        self._idle.append(conn)
                        continue
                    self._retire(conn)
                    raise EdgebuildError(f"conformance worker failed to start: {message}")
                case, _ = self._busy.pop(conn)
                if message is None:
                    self._retire(conn)
                    self._start()
                    message = {"status": "error", "reason": "the worker process died while running this case"}
                else:
                    self._idle.append(conn)
                done(case, message)
            now = time.monotonic()
            for conn, (case, started) in list(self._busy.items()):
                if now - started > self._timeout:
                    del self._busy[conn]
                    self._retire(conn)
                    self._start()
                    done(case, {"status": "error", "reason": f"timed out after {self._timeout:g} s"})

    def close(self) -> None:
        for conn in list(self._procs):
            try:
                conn.send(None)
            except OSError:
                pass
            process = self._procs.pop(conn)
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
