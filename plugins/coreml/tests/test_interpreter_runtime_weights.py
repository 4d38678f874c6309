"""Ops whose weights are fed at run time (a conv whose kernel is a graph input, as JAX exports and
dynamic filters make them): every call reads them afresh, however the interpreter reuses a call
it prepared for an op's constants."""

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
ort = pytest.importorskip("onnxruntime")

from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from edgebuild_coreml.interpreter import run_program, torch_kernels  # noqa: E402
from edgebuild_coreml.interpreter.executor import run_program_samples  # noqa: E402

CASES = [  # (channels, filters, groups, kernel, stride)
    (4, 4, 4, 3, 1),  # depthwise
    (4, 8, 1, 3, 1),
    (4, 8, 1, 1, 1),  # pointwise: one matrix product
    (6, 6, 2, 3, 2),
    (1, 3, 1, 5, 1),
]


def _program(channels, filters, groups, kernel, stride, with_bias):
    specs = [mb.TensorSpec(shape=(1, channels, 9, 9)), mb.TensorSpec(shape=(filters, channels // groups, kernel, kernel))]
    if with_bias:
        specs.append(mb.TensorSpec(shape=(filters,)))

    geometry = dict(groups=groups, strides=[stride, stride], pad_type="same" if stride == 1 else "valid")
    if with_bias:
        @mb.program(input_specs=specs, opset_version=ct.target.iOS17)
        def program(x, w, b):
            return mb.conv(x=x, weight=w, bias=b, **geometry)
    else:
        @mb.program(input_specs=specs, opset_version=ct.target.iOS17)
        def program(x, w):
            return mb.conv(x=x, weight=w, **geometry)

    return program


def _onnx_conv(x, w, b, groups, stride):
    pads = {"auto_pad": "SAME_UPPER"} if stride == 1 else {}
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node("Conv", inputs, ["y"], group=groups, strides=[stride, stride], **pads)
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs]
    graph = helper.make_graph([node], "conv", values, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": x, "w": w, **({"b": b} if b is not None else {})}
    return session.run(None, feed)[0]


@pytest.fixture(params=[False, True], ids=["numpy", "torch"])
def kernels(request):
    was = torch_kernels.enabled()
    if request.param and not torch_kernels.enable(1):
        pytest.skip("torch is not installed")
    if not request.param:
        torch_kernels.disable()
    yield request.param
    torch_kernels.disable()
    if was:
        torch_kernels.enable()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[f"c{c}f{f}g{g}k{k}s{s}" for c, f, g, k, s in CASES])
def test_a_run_time_kernel_is_read_on_every_call(kernels, case, with_bias):
    channels, filters, groups, kernel, stride = case
    program = _program(channels, filters, groups, kernel, stride, with_bias)
    names = list(program.functions["main"].inputs)
    rng = np.random.default_rng(sum(case))
    samples = []
    for _ in range(4):  # new weights every call, the input's shape the same
        sample = [rng.standard_normal((1, channels, 9, 9)).astype(np.float32),
                  rng.standard_normal((filters, channels // groups, kernel, kernel)).astype(np.float32)]
        if with_bias:
            sample.append(rng.standard_normal(filters).astype(np.float32))
        samples.append(sample)
    for sample in samples:
        got = list(run_program(program, dict(zip(names, sample))).values())[0]
        want = _onnx_conv(sample[0], sample[1], sample[2] if with_bias else None, groups, stride)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    batched = run_program_samples(program, [dict(zip(names, sample)) for sample in samples])
    for sample, outputs in zip(samples, batched):
        want = _onnx_conv(sample[0], sample[1], sample[2] if with_bias else None, groups, stride)
        np.testing.assert_allclose(list(outputs.values())[0], want, rtol=1e-4, atol=1e-4)
