"""How the validate stage runs its candidate's samples: a runner that offers its own way of running
several at once (the MIL interpreter's worker processes) is run that way, in order, and its pool
closes with the stage; any other runner is called in threads. A runner that runs several samples
a call (``run_many``) is handed them in even calls of up to its ``samples_per_call``."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

from edgebuild.dag.validate import WORKERS_ENV, calls_of, in_chunks, map_samples, sample_runner


class _Offering:
    """A runner with ``samples_in_parallel``: records what it was asked and when its pool closed."""

    def __init__(self, workers_given: int):
        self.workers_given = workers_given
        self.asked: list[int] = []
        self.closed = False
        self.threads: set[str] = set()

    def __call__(self, sample):
        return ("here", sample)

    @contextlib.contextmanager
    def samples_in_parallel(self, workers):
        self.asked.append(workers)

        def run(sample):
            self.threads.add(threading.current_thread().name)
            return ("pooled", sample)

        try:
            yield run, self.workers_given
        finally:
            self.closed = True


def test_an_offering_runner_runs_its_own_way_and_closes(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    runner = _Offering(workers_given=2)
    done = []
    with sample_runner(runner, 6) as (run, workers):
        results = map_samples(run, list(range(6)), workers=workers, on_done=done.append)
    assert runner.asked == [2] and runner.closed and workers == 2
    assert results == [("pooled", i) for i in range(6)]  # in the samples' order
    assert done == [1, 2, 3, 4, 5, 6]
    assert all(name.startswith("validate") for name in runner.threads)


def test_a_runner_may_choose_one_sample_at_a_time(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    runner = _Offering(workers_given=1)
    with sample_runner(runner, 4) as (run, workers):
        map_samples(run, list(range(4)), workers=workers)
    assert workers == 1 and runner.threads == {threading.current_thread().name}


def test_serial_validation_and_plain_runners_are_left_alone(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    runner = _Offering(workers_given=2)
    with sample_runner(runner, 4, parallel=False) as (run, workers):
        assert (run, workers) == (runner, 1)
    assert runner.asked == []

    def plain(sample):
        return sample

    with sample_runner(plain, 4) as (run, workers):
        assert (run, workers) == (plain, 2)


def test_an_error_closes_the_pool(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    runner = _Offering(workers_given=2)
    with pytest.raises(RuntimeError), sample_runner(runner, 4) as (run, workers):
        raise RuntimeError("a sample failed")
    assert runner.closed


class _Batching:
    """A runner that runs several samples a call (the MIL interpreter): records each call's size."""

    def __init__(self, per_call: int):
        self.samples_per_call = per_call
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, sample):
        return self.run_many([sample])[0]

    def run_many(self, samples):
        with self.lock:
            self.calls.append(len(samples))
        return [{"y": np.maximum(sample["x"], 0)} for sample in samples]


@pytest.mark.parametrize(("samples", "workers", "per_call", "size"),
                         [(32, 2, 8, 8), (5, 2, 8, 3), (5, 1, 2, 2), (3, 2, 1, 1), (1, 2, 8, 1)])
def test_a_batching_runner_gets_even_calls_of_up_to_its_size(samples, workers, per_call, size):
    run_many, chosen = calls_of(_Batching(per_call), samples, workers)
    assert chosen == size
    assert [len(chunk) for chunk in in_chunks(list(range(samples)), chosen)] == \
        [size] * (samples // size) + ([samples % size] if samples % size else [])


def test_a_plain_runner_is_called_once_per_sample():
    seen = []
    run_many, size = calls_of(lambda sample: seen.append(sample) or -sample, 6, 2)
    assert size == 1 and run_many([1, 2]) == [-1, -2] and seen == [1, 2]


def test_the_stage_hands_a_batching_runner_its_samples_in_calls_and_counts_samples(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, save

    from edgebuild import progress
    from edgebuild.dag.validate import validate
    from edgebuild.recipe.validation import ValidateSection

    monkeypatch.setenv(WORKERS_ENV, "2")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    runner, seen = _Batching(per_call=2), []
    with progress.reporting(lambda step, done, total: seen.append((done, total))):
        record = validate(ValidateSection(samples=5), tmp_path / "m.onnx", {}, runner, tmp_path)
    assert sorted(runner.calls) == [1, 2, 2]
    assert seen == [(2, 5), (4, 5), (5, 5)]
    assert record["samples"] == 5 and record["failures"] == []
    assert record["runtimes"]["interpreter"]["metrics"]["y"]["cosine"]["min"] > 1 - 1e-9
