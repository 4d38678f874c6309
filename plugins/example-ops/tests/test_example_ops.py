"""com.example::RMSNorm: the reference, the Metal kernel (CPU emulation) and what the plugin
registers with and without edgebuild-msl."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgebuild.plugin import OpReference, get_registry

from edgebuild_example_ops import DOMAIN, OP_TYPE, plugin
from edgebuild_example_ops.reference import rms_norm

rng = np.random.default_rng(11)


def test_reference_matches_the_formula():
    x, scale = rng.standard_normal((3, 8)), rng.standard_normal(8)
    expected = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(rms_norm(x, scale), expected, rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 301)])  # 301: rows not a multiple of the threads
def test_metal_kernel_matches_reference(shape):
    pytest.importorskip("edgebuild_msl")
    from edgebuild_msl import compile_kernel

    from edgebuild_example_ops.kernel import rms_norm_kernel

    x = rng.standard_normal(shape).astype(np.float32)
    scale = rng.standard_normal(shape[-1]).astype(np.float32)
    out = compile_kernel(rms_norm_kernel()).run({"X": x, "scale": scale}, {"epsilon": 1e-5})
    np.testing.assert_allclose(out["Y"], rms_norm(x, scale, epsilon=1e-5), rtol=1e-5, atol=1e-5)


def test_the_installed_plugin_registers_the_op_its_lowering_and_its_pass():
    registry = get_registry()
    spec = registry.get("custom_ops", (DOMAIN, OP_TYPE))
    x, scale = rng.standard_normal((2, 8)).astype(np.float32), np.full(8, 2.0, np.float32)
    got = spec.run_reference({"X": x, "scale": scale}, {"epsilon": 1e-5})
    np.testing.assert_allclose(got["Y"], rms_norm(x, scale, epsilon=1e-5), rtol=1e-6)
    assert registry.lowering("coreml", OP_TYPE, DOMAIN, 1) is not None
    assert registry.get("passes", "fuse_example_rms_norm").default is False


def _registered_op(monkeypatch, with_kernel_sdk: bool):
    monkeypatch.setattr(plugin, "has_kernel_sdk", lambda: with_kernel_sdk)
    registered = {}
    plugin.edgebuild_register_custom_ops(register=lambda domain, op_type, spec: registered.update({op_type: spec}))
    return registered[OP_TYPE]


def test_without_edgebuild_msl_the_op_is_registered_by_its_reference(monkeypatch):
    spec = _registered_op(monkeypatch, with_kernel_sdk=False)
    assert isinstance(spec, OpReference) and list(spec.inputs) == ["X", "scale"]
    x, scale = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(spec.run_reference({"X": x, "scale": scale})["Y"], rms_norm(x, scale), rtol=1e-6)


def test_with_edgebuild_msl_the_op_is_registered_by_its_kernel(monkeypatch):
    pytest.importorskip("edgebuild_msl")
    spec = _registered_op(monkeypatch, with_kernel_sdk=True)
    assert spec.entry == "rms_norm" and spec.schema is not None


WITHOUT_MSL = """
import sys
sys.modules["edgebuild_msl"] = None  # importing it raises ImportError, as when the [msl] extra is not installed
from edgebuild_example_ops import plugin
registered = {}
for hook in (plugin.edgebuild_register_custom_ops, plugin.edgebuild_register_lowerings,
             plugin.edgebuild_register_passes):
    hook(register=lambda *args, **kw: registered.setdefault(hook.__name__, args))
import edgebuild_example_ops.coreml, edgebuild_example_ops.fusion  # the lowering and the pass need no msl
print(type(registered["edgebuild_register_custom_ops"][2]).__name__)
"""


def test_the_plugin_registers_and_lowers_without_edgebuild_msl():
    done = subprocess.run([sys.executable, "-c", WITHOUT_MSL], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OpReference"
