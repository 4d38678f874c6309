"""The worker preload (``dask worker --preload edgebuild.dag.dask_worker``): plugins imported as the
worker starts, numeric libraries on the worker's own threads."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from edgebuild.dag import dask_worker
from edgebuild.dag.validate import WORKERS_ENV

THREAD_VARIABLES = (WORKERS_ENV, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@pytest.fixture
def setup(monkeypatch):
    """dask_setup with the registry and threadpoolctl recorded instead of acting on this process."""
    for variable in THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    calls = {"load_all": 0, "blas": []}

    class Registry:
        def load_all(self):
            calls["load_all"] += 1
            return self

    import edgebuild.registry

    monkeypatch.setattr(edgebuild.registry, "get_registry", lambda: Registry())
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda limits: calls["blas"].append(limits))

    def run(nthreads: int):
        dask_worker.dask_setup(SimpleNamespace(state=SimpleNamespace(nthreads=nthreads)))
        return calls

    return run


def test_the_preload_loads_every_plugin_and_runs_numeric_libraries_on_the_workers_threads(setup):
    calls = setup(1)
    assert calls["load_all"] == 1
    assert calls["blas"] == [1]
    assert {variable: os.environ[variable] for variable in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, "1")


def test_the_preload_keeps_what_the_worker_was_started_with(setup, monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    setup(3)
    assert os.environ[WORKERS_ENV] == "2"
    assert os.environ["OMP_NUM_THREADS"] == "3"
