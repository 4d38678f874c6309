"""The interpreter's runner in worker processes (what the validate stage uses to run samples on
both cores): same results as in the build's process, errors whole, no worker left behind."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from edgebuild_coreml.interpreter import artifact_runner
from edgebuild_coreml.interpreter.artifact_runner import (
    PROCESS_MIN_ELEMENTS,
    ArtifactRunner,
    activation_elements,
)
from interpreter_programs import saved, spec

from edgebuild.errors import BuildError


def _conv_program():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)

    @mb.program(input_specs=[spec((1, 3, 16, 16))])
    def prog(x):
        y = mb.conv(x=x, weight=weight, pad_type="same", name="conv")
        return mb.relu(x=mb.add(x=y, y=np.float32(0.5)), name="y_out")

    return prog


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = saved(_conv_program(), tmp_path_factory.mktemp("pool") / "m.mlpackage")
    # the ONNX name "y" was renamed to the MIL name "y_out" by the lower stage
    return ArtifactRunner(path, lowered={"renamed_outputs": {"y": "y_out"}})


def _samples(count):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


def _assert_same_outputs(actual, expected):
    """Workers compute convs with torch's kernels, this process with numpy's: the same fp32 sums
    in another order, so they agree to rounding relative to the outputs' scale, not bit for bit."""
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6 * float(np.abs(expected).max()))


def test_workers_give_what_the_build_process_gives(runner):
    from concurrent.futures import ThreadPoolExecutor

    samples = _samples(4)
    here = [runner(s) for s in samples]
    with runner.in_processes(2) as pooled, ThreadPoolExecutor(2) as threads:
        there = list(threads.map(pooled, samples))
    for mine, theirs in zip(here, there):
        assert set(theirs) == {"y"}
        _assert_same_outputs(theirs["y"], mine["y"])
    assert not multiprocessing.active_children()


def test_a_call_of_several_samples_gives_each_its_own_outputs(runner):
    """``run_many`` (several samples op by op: the validate stage's calls) here and in a worker."""
    samples = _samples(5)
    here = [runner(s) for s in samples]
    together = runner.run_many(samples)
    with runner.in_processes(2) as pooled:
        assert pooled.samples_per_call == runner.samples_per_call
        there = pooled.run_many(samples)
    for mine, ours, theirs in zip(here, together, there):
        assert set(ours) == set(theirs) == {"y"}
        np.testing.assert_allclose(ours["y"], mine["y"], rtol=1e-6, atol=1e-6)
        _assert_same_outputs(theirs["y"], mine["y"])
    assert not multiprocessing.active_children()


def test_samples_per_call_keeps_a_call_within_its_value_budget(runner, monkeypatch):
    elements = artifact_runner.declared_elements(runner.program)
    assert elements == 2 * 8 * 16 * 16  # the conv's output and the relu's (the add became the conv's bias)
    assert runner.samples_per_call == artifact_runner.SAMPLES_PER_CALL
    monkeypatch.setattr(artifact_runner, "CALL_ELEMENTS", 3 * elements + 1)
    assert runner.samples_per_call == 3
    monkeypatch.setattr(artifact_runner, "CALL_ELEMENTS", elements - 1)
    assert runner.samples_per_call == 1


def test_an_error_in_a_worker_keeps_its_message_and_hint(runner):
    with runner.in_processes(2) as pooled, pytest.raises(BuildError, match=r"input\(s\) 'x' not given") as caught:
        pooled({"z": np.zeros((1, 3, 16, 16), np.float32)})
    assert "the program expects: 'x'" in caught.value.hint
    assert not multiprocessing.active_children()


def test_workers_are_killed_when_the_block_raises(runner):
    with pytest.raises(KeyboardInterrupt), runner.in_processes(2) as pooled:
        pooled(_samples(1)[0])
        assert multiprocessing.active_children()
        raise KeyboardInterrupt
    assert not multiprocessing.active_children()


def test_a_small_program_runs_one_sample_at_a_time_in_the_build_process(runner):
    assert activation_elements(runner.program) < PROCESS_MIN_ELEMENTS
    with runner.samples_in_parallel(2) as (run, workers):
        assert (run, workers) == (runner, 1)


def test_workers_asked_for_run_a_large_programs_samples_from_the_first(runner, monkeypatch):
    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.setenv("EDGEBUILD_VALIDATE_WORKERS", "2")
    sample = _samples(1)[0]
    with runner.samples_in_parallel(2) as (run, workers):
        assert workers == 2 and isinstance(run, artifact_runner._WorkerPool)
        assert len(multiprocessing.active_children()) == 2
        _assert_same_outputs(run(sample)["y"], runner(sample)["y"])
    assert not multiprocessing.active_children()


def _counting_pool_calls(monkeypatch) -> list:
    calls = []
    original = artifact_runner._WorkerPool.run_many

    def counted(self, samples):
        calls.append(len(samples))
        return original(self, samples)

    monkeypatch.setattr(artifact_runner._WorkerPool, "run_many", counted)
    return calls


def test_samples_that_take_less_than_a_start_never_start_workers(runner, monkeypatch):
    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.delenv("EDGEBUILD_VALIDATE_WORKERS", raising=False)
    monkeypatch.setattr(artifact_runner, "WORKER_START_SECONDS", 3600.0)
    samples = _samples(6)
    with runner.samples_in_parallel(2) as (run, workers):
        assert workers == 2
        outputs = [run(s) for s in samples]
        assert not multiprocessing.active_children()
    for sample, output in zip(samples, outputs):
        np.testing.assert_allclose(output["y"], runner(sample)["y"], rtol=1e-6, atol=1e-6)


def test_samples_that_take_as_long_as_a_start_go_on_in_workers_once_ready(runner, monkeypatch):
    import time

    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.delenv("EDGEBUILD_VALIDATE_WORKERS", raising=False)
    monkeypatch.setattr(artifact_runner, "WORKER_START_SECONDS", 0.0)  # the first call here pays for a start
    pool_calls = _counting_pool_calls(monkeypatch)
    samples = _samples(3)
    with runner.samples_in_parallel(2) as (run, workers):
        first = run(samples[0])
        assert pool_calls == []  # ran here, and started the workers
        deadline = time.monotonic() + 300  # a bound for a slow machine, not a measurement
        while run._pool is None and time.monotonic() < deadline:
            run(samples[1])  # meanwhile samples go on here
        assert run._pool is not None, "the workers never came up"
        last = run.run_many(samples[1:])
        assert pool_calls == [2]
    assert not multiprocessing.active_children()
    _assert_same_outputs(first["y"], runner(samples[0])["y"])
    for sample, output in zip(samples[1:], last):
        _assert_same_outputs(output["y"], runner(sample)["y"])


def test_leaving_while_workers_start_does_not_wait_for_them(runner, monkeypatch):
    import threading

    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.delenv("EDGEBUILD_VALIDATE_WORKERS", raising=False)
    monkeypatch.setattr(artifact_runner, "WORKER_START_SECONDS", 0.0)
    release = threading.Event()
    started = artifact_runner._WorkerPool.__init__

    def held(self, *args, **kwargs):  # a start that cannot finish before the block is left
        release.wait()
        started(self, *args, **kwargs)

    monkeypatch.setattr(artifact_runner._WorkerPool, "__init__", held)
    with runner.samples_in_parallel(2) as (run, _):
        run(_samples(1)[0])
        starter = run._starter
    assert starter.is_alive()  # left without waiting for it
    release.set()
    starter.join(timeout=300)
    assert not starter.is_alive() and not multiprocessing.active_children()  # it stopped the pool itself


def test_a_worker_that_dies_fails_the_calls_with_a_hint(runner):
    import os
    import signal

    with runner.in_processes(2) as pooled:
        pooled(_samples(1)[0])
        for worker in multiprocessing.active_children():
            os.kill(worker.pid, signal.SIGKILL)
        for _ in range(3):  # every later call too, none of them waiting forever for a worker
            with pytest.raises(BuildError, match="died") as caught:
                pooled(_samples(1)[0])
            assert "EDGEBUILD_VALIDATE_WORKERS=1" in caught.value.hint
    assert not multiprocessing.active_children()


def test_calls_from_more_threads_than_workers_wait_for_an_idle_one(runner):
    from concurrent.futures import ThreadPoolExecutor

    samples = _samples(12)
    with runner.in_processes(2) as pooled, ThreadPoolExecutor(5) as threads:
        there = list(threads.map(pooled, samples))
    for sample, theirs in zip(samples, there):
        _assert_same_outputs(theirs["y"], runner(sample)["y"])
    assert not multiprocessing.active_children()


def test_told_no_sample_is_left_it_starts_no_workers_whatever_a_start_costs(runner, monkeypatch):
    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.delenv("EDGEBUILD_VALIDATE_WORKERS", raising=False)
    monkeypatch.setattr(artifact_runner, "WORKER_START_SECONDS", 0.0)
    samples = _samples(2)
    with runner.samples_in_parallel(2, samples=2) as (run, _):
        run.run_many(samples)  # the last two: nothing left that workers could take
        assert run._starter is None
    assert not multiprocessing.active_children()


def test_told_many_samples_are_coming_it_starts_workers_after_the_first(runner, monkeypatch):
    monkeypatch.setattr(artifact_runner, "PROCESS_MIN_ELEMENTS", 1)
    monkeypatch.delenv("EDGEBUILD_VALIDATE_WORKERS", raising=False)
    monkeypatch.setattr(artifact_runner, "WORKER_START_SECONDS", 3600.0)
    with runner.samples_in_parallel(2, samples=10**9) as (run, _):  # an hour's start pays for them
        run(_samples(1)[0])
        starter = run._starter
        assert starter is not None
    starter.join(timeout=300)
    assert not starter.is_alive() and not multiprocessing.active_children()
