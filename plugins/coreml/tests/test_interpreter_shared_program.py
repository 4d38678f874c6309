"""Runners on one package share the program read for the first of them (and its plans); a
package rebuilt in place is read again."""

from __future__ import annotations

import os

import numpy as np
from coremltools.converters.mil import Builder as mb
from edgebuild_coreml.interpreter.artifact_runner import ArtifactRunner
from interpreter_programs import saved, spec


def _program(offset: float):
    @mb.program(input_specs=[spec((1, 4))])
    def prog(x):
        return mb.add(x=x, y=np.float32(offset), name="y")

    return prog


def test_a_second_runner_on_a_package_reuses_its_program_and_gives_the_same_outputs(tmp_path):
    path = saved(_program(1.0), tmp_path / "m.mlpackage")
    first, emulating = ArtifactRunner(path), ArtifactRunner(path, emulate_fp16=True)
    assert emulating.program is first.program
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_allclose(first({"x": x})["y"], x + 1)
    np.testing.assert_allclose(emulating({"x": x})["y"], x + 1)


def test_a_package_rewritten_in_place_is_read_again(tmp_path):
    path = saved(_program(1.0), tmp_path / "m.mlpackage")
    before = ArtifactRunner(path)
    moved = saved(_program(2.0), tmp_path / "other.mlpackage")
    for old in sorted(path.rglob("*"), reverse=True):  # the same path, new files
        os.remove(old) if old.is_file() else old.rmdir()
    moved.rename(path)
    after = ArtifactRunner(path)
    assert after.program is not before.program
    x = np.zeros((1, 4), np.float32)
    np.testing.assert_allclose(after({"x": x})["y"], x + 2)
