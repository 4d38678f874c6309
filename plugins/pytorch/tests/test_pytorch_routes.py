"""Both routes on small modules: ONNX (checked with onnxruntime) and coremltools (checked with
the MIL interpreter), each against the eager module. Exporting takes seconds: slow, but for the
TorchScript import (about a second), which runs by default."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_pytorch.frontend import PyTorchFrontend  # noqa: E402

import pytorch_test_factories as factories  # noqa: E402

X = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)


def run_onnx(path, feed):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


@pytest.fixture
def tiny(tmp_path):
    torch.manual_seed(1)
    module = factories.TinyNet().eval()
    path = tmp_path / "tiny.pt"
    torch.save(module.state_dict(), path)
    with torch.no_grad():
        expected = {k: v.numpy() for k, v in module(torch.from_numpy(X)).items()}
    return path, expected


@pytest.mark.slow
def test_state_dict_through_onnx(tiny, tmp_path):
    path, expected = tiny
    out = tmp_path / "out"
    report = PyTorchFrontend().import_model(path, {"x": {"shape": [1, 3, 8, 8]}}, out,
                                            options={"factory": "pytorch_test_factories:TinyNet", "route": "onnx"})
    assert report["route"] == "onnx" and report["fallback_reason"] is None
    assert (out / "model.onnx").is_file() and json.loads((out / "route.json").read_text())["route"] == "onnx"
    got = run_onnx(out / "model.onnx", {"x": X})
    assert set(got) == {"logits", "features"}
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


def test_torchscript_with_fixed_scalar_through_onnx(tmp_path):
    path = tmp_path / "scaled.jit"
    torch.jit.script(factories.Scaled()).save(str(path))
    out = tmp_path / "out"
    report = PyTorchFrontend().import_model(
        path, {"x": {"shape": [2, 8]}, "scale": {"value": 2, "dtype": "int64"}}, out, options={"output_names": ["y"]})
    assert report["kind"] == "torchscript" and report["fixed_inputs"] == ["scale"]
    assert list(report["inputs"]) == ["x"]  # the fixed input is gone from the graph
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    got = run_onnx(out / "model.onnx", {"x": x})["y"]
    np.testing.assert_allclose(got, np.tanh(x * np.linspace(-1, 1, 8) * 2.0), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_exported_program_file(tiny, tmp_path):
    path, expected = tiny
    module = factories.TinyNet().eval()
    module.load_state_dict(torch.load(path))
    program = torch.export.export(module, (torch.from_numpy(X),))
    pt2 = tmp_path / "tiny.pt2"
    torch.export.save(program, str(pt2))
    out = tmp_path / "out"
    report = PyTorchFrontend().import_model(pt2, {"x": {"shape": [1, 3, 8, 8]}}, out)
    assert report["kind"] == "exported_program"
    got = run_onnx(out / "model.onnx", {"x": X})
    np.testing.assert_allclose(got["logits"], expected["logits"], rtol=1e-4, atol=1e-5)


def run_mlpackage(path, feed):
    pytest.importorskip("edgebuild_coreml")
    from edgebuild_coreml.interpreter import load_mlpackage, run_program

    return run_program(load_mlpackage(path), feed)


@pytest.mark.slow
def test_state_dict_through_coremltools(tiny, tmp_path):
    path, expected = tiny
    out = tmp_path / "out"
    report = PyTorchFrontend().import_model(path, {"x": {"shape": [1, 3, 8, 8]}}, out,
                                            options={"factory": "pytorch_test_factories:TinyNet", "route": "coreml"})
    assert report["route"] == "coreml" and not (out / "model.onnx").exists()
    assert json.loads((out / "route.json").read_text())["artifact"] == "model.mlpackage"
    assert (out / "model.pt2").is_file()
    got = run_mlpackage(out / "model.mlpackage", {"x": X})
    for name in expected:
        np.testing.assert_allclose(np.asarray(got[name]), expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_auto_falls_back_to_coremltools_with_the_reason(tiny, tmp_path, monkeypatch):
    import edgebuild_pytorch.onnx_route as onnx_route

    def refuse(*args, **kwargs):
        raise RuntimeError("no ONNX symbolic for aten::fancy_op")

    monkeypatch.setattr(onnx_route, "import_through_onnx", refuse)
    path, expected = tiny
    out = tmp_path / "out"
    report = PyTorchFrontend().import_model(path, {"x": {"shape": [1, 3, 8, 8]}}, out,
                                            options={"factory": "pytorch_test_factories:TinyNet"})
    assert report["route"] == "coreml"
    assert report["fallback_reason"] == "ONNX export failed: RuntimeError: no ONNX symbolic for aten::fancy_op"
    assert json.loads((out / "route.json").read_text())["fallback_reason"] == report["fallback_reason"]
    got = run_mlpackage(out / "model.mlpackage", {"x": X})
    np.testing.assert_allclose(np.asarray(got["logits"]), expected["logits"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_forced_onnx_route_reports_the_exporter_failure(tiny, tmp_path, monkeypatch):
    import edgebuild_pytorch.onnx_route as onnx_route

    monkeypatch.setattr(onnx_route, "import_through_onnx",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("unsupported op")))
    path, _ = tiny
    with pytest.raises(BuildError, match="tiny.pt: the ONNX exporter failed: RuntimeError: unsupported op"):
        PyTorchFrontend().import_model(path, {"x": {"shape": [1, 3, 8, 8]}}, tmp_path / "out",
                                       options={"factory": "pytorch_test_factories:TinyNet", "route": "onnx"})
