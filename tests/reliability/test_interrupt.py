"""Ctrl-C stops the executor: a stage body that swallows the interrupt cannot keep the run going,
and stages on worker threads (``-j 2``) stop too. (A CLI build interrupted mid-stage: test_cache;
every stage of a Core ML build: the Core ML plugin's tests.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest


def test_an_interrupt_a_stage_body_swallows_still_stops_the_run():
    """A library that catches KeyboardInterrupt (coremltools' bare excepts) cannot keep the build going."""
    from edgebuild.dag.executor import Executor, Job
    from edgebuild.stage import Stage

    ran, sleeping = [], threading.Event()

    def swallowing(params, inputs, out):
        try:  # like coremltools' `try: import torch` with a bare except around it
            sleeping.set()
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - the point of the test
            ran.append("swallowed")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the rest of the stage's work
            time.sleep(0.01)
        return {}

    def later(params, inputs, out):
        ran.append("later")
        return {}

    job = Job("t:v", [Stage("slow", {}, [], swallowing), Stage("after", {}, ["slow"], later)])
    def interrupt_once_it_sleeps():  # not after a fixed delay: a loaded machine may start the stage late
        sleeping.wait(timeout=20)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt_once_it_sleeps, daemon=True)
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        Executor(None).run([job])
    assert time.monotonic() - start < 25  # well before the stage's own 30 s of work
    assert "swallowed" in ran and "later" not in ran
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("target", ["process", "worker-thread"])
def test_ctrl_c_interrupts_stages_running_on_worker_threads(target):
    """-j 2: both running stage bodies stop, and the run raises KeyboardInterrupt. In a process of
    its own, whose main thread runs the executor as the CLI's does (a test runner's worker may
    handle SIGINT itself). The kernel hands a process's SIGINT to any thread that does not block
    it: "worker-thread" sends it to a busy worker's thread, where only its flag is set and the
    main thread must still come round to run the handler."""
    script = WORKER_THREADS_INTERRUPTED.replace("TARGET", target)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stopped, alive, seconds, handler_restored = json.loads(done.stdout)
    assert sorted(stopped) == ["edgebuild-jobs-0", "edgebuild-jobs-1"]  # both workers, not the main thread
    assert alive == []  # none runs on past the interrupt
    assert seconds < 30 and handler_restored  # well before the bodies' own 30 s of work


WORKER_THREADS_INTERRUPTED = """
import json, os, signal, threading, time
from edgebuild.dag.executor import Executor, Job
from edgebuild.stage import Stage

started, finished, running, workers_ids = set(), set(), threading.Semaphore(0), []

def busy(params, inputs, out):
    # A body that was stopped is one that started and never reached its end: nothing is recorded
    # inside an except clause, where the interrupt repeated every 0.1 s could land again first.
    name = threading.current_thread().name
    started.add(name)
    workers_ids.append(threading.get_ident())
    running.release()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # Python work: an interrupt reaches it between bytecodes
        sum(range(1000))
    finished.add(name)
    return {}

def interrupt_once_both_run():  # not after a fixed delay: a loaded machine may start the second body late
    if all(running.acquire(timeout=120) for _ in range(2)):
        if "TARGET" == "process":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            signal.pthread_kill(workers_ids[0], signal.SIGINT)

jobs = [Job(f"t:{name}", [Stage("work", {"variant": name}, [], busy)]) for name in ("a", "b")]
threading.Thread(target=interrupt_once_both_run, daemon=True).start()
start = time.monotonic()
try:
    Executor(None, jobs=2).run(jobs)
    raise SystemExit("the run was not interrupted")
except KeyboardInterrupt:
    pass
workers = [t for t in threading.enumerate() if t.name.startswith("edgebuild-jobs")]
for thread in workers:  # each has left its body and only ends its thread now
    thread.join(timeout=30)  # a loaded machine may take seconds to schedule a thread out of its body
alive = [t.name for t in workers if t.is_alive()]
print(json.dumps([sorted(started - finished), alive, time.monotonic() - start,
                  signal.getsignal(signal.SIGINT) is signal.default_int_handler]))
"""
