"""How the validate stage runs its candidate's samples: a runner that offers its own way of running
several at once (the MIL interpreter's worker processes) is run that way, in order, and its pool
closes with the stage; any other runner is called in threads."""

from __future__ import annotations

import contextlib
import threading

import pytest

from edgebuild.dag.validate import WORKERS_ENV, map_samples, sample_runner


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
