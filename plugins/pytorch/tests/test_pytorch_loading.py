"""Loading PyTorch sources and the eager reference: errors a user can act on, state handled."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgebuild.errors import BuildError, UsageError  # noqa: E402
from edgebuild_pytorch.capture import output_names  # noqa: E402
from edgebuild_pytorch.frontend import PyTorchFrontend  # noqa: E402
from edgebuild_pytorch.loading import load_source  # noqa: E402
from edgebuild_pytorch.options import PyTorchOptions  # noqa: E402
from edgebuild_pytorch.reference import reference_runner  # noqa: E402

import pytorch_test_factories as factories  # noqa: E402

TINY = "pytorch_test_factories:TinyNet"


@pytest.fixture
def tiny_weights(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tiny.pt"
    torch.save(factories.TinyNet().state_dict(), path)
    return path


def test_factory_that_raises_is_named(tiny_weights, tmp_path):
    with pytest.raises(BuildError) as info:
        PyTorchFrontend().import_model(tiny_weights, {"x": {"shape": [1, 3, 8, 8]}}, tmp_path / "out",
                                       options={"factory": "pytorch_test_factories:broken"})
    message = str(info.value)
    assert "'pytorch_test_factories:broken'" in message
    assert "RuntimeError: weights server unreachable" in message


@pytest.mark.parametrize("factory, message", [
    ("no_such_package_xyz.models:Net", "cannot import 'no_such_package_xyz.models'"),
    ("pytorch_test_factories:Missing", "has no attribute 'Missing'"),
    ("pytorch_test_factories:not_a_module", "returned str, not a torch.nn.Module"),
])
def test_unusable_factories(tiny_weights, factory, message):
    with pytest.raises(BuildError, match=message):
        load_source(tiny_weights, PyTorchOptions(factory=factory))


def test_state_dict_mismatch_names_first_keys(tmp_path):
    state = factories.TinyNet().state_dict()
    state["classifier.weight"] = state.pop("head.weight")
    path = tmp_path / "renamed.pt"
    torch.save(state, path)
    with pytest.raises(BuildError) as info:
        load_source(path, PyTorchOptions(factory=TINY))
    message = str(info.value)
    assert "renamed.pt does not match the module from 'pytorch_test_factories:TinyNet'" in message
    assert "1 key(s) missing from the file: head.weight" in message
    assert "1 key(s) not in the module: classifier.weight" in message


def test_state_dict_shape_mismatch_names_shapes(tiny_weights):
    with pytest.raises(BuildError, match=r"conv.weight \(module \[6, 3, 3, 3\], file \[4, 3, 3, 3\]\)"):
        load_source(tiny_weights, PyTorchOptions(factory=TINY, factory_kwargs={"channels": 6}))


def test_pickled_code_is_not_loaded(tmp_path):
    path = tmp_path / "whole_module.pt"
    torch.save(factories.TinyNet(), path)  # a pickled module object, not a state_dict
    with pytest.raises(BuildError, match="weights_only=True"):
        load_source(path, PyTorchOptions(factory=TINY))


def test_state_dict_without_factory_is_a_usage_error(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"")
    with pytest.raises(UsageError, match="needs the module it belongs to"):
        load_source(path, PyTorchOptions())


def test_reference_matches_eager_module_with_named_outputs(tiny_weights):
    runner = reference_runner(tiny_weights, {"factory": TINY})
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = runner({"x": x})
    module = factories.TinyNet()
    module.load_state_dict(torch.load(tiny_weights))
    with torch.no_grad():
        expected = module(torch.from_numpy(x))
    assert set(got) == {"logits", "features"}
    np.testing.assert_allclose(got["logits"], expected["logits"].numpy(), rtol=1e-6, atol=1e-6)


def test_reference_restarts_stateful_torchscript_and_passes_scalars(tmp_path):
    path = tmp_path / "stateful.jit"
    torch.jit.script(factories.Stateful()).save(str(path))
    runner = reference_runner(path, {})
    x = np.ones((1, 8), dtype=np.float32)
    first, second = runner({"x": x})["output"], runner({"x": x})["output"]
    np.testing.assert_array_equal(first, 2.0 * x)  # from the saved (zero) state, every time
    np.testing.assert_array_equal(second, first)

    scaled = tmp_path / "scaled.jit"
    torch.jit.script(factories.Scaled()).save(str(scaled))
    out = reference_runner(scaled, {})({"x": x, "scale": np.asarray(2, dtype=np.int64)})["output"]
    np.testing.assert_allclose(out, np.tanh(x * np.linspace(-1, 1, 8) * 2.0), rtol=1e-6)


def test_output_names_follow_structure_or_recipe():
    t = torch.zeros(1)
    assert output_names(t) == ["output"]
    assert output_names((t, t)) == ["output_0", "output_1"]
    assert output_names({"a": t, "b": (t, t)}) == ["a", "b_0", "b_1"]
    assert output_names((t, t), ["boxes", "scores"]) == ["boxes", "scores"]
    with pytest.raises(UsageError, match="1 name"):
        output_names((t, t), ["boxes"])


def test_input_specs_for_validation():
    specs = PyTorchFrontend().input_specs({"x": {"shape": [1, 512], "dtype": "float32"},
                                           "sr": {"value": 16000, "dtype": "int64"}})
    assert specs == {"x": {"shape": [1, 512], "dtype": "float32"},
                     "sr": {"shape": [], "dtype": "int64", "value": 16000}}
