"""Input, output and state names survive every layer: lowering, package, validation,
``InferenceSession``, ``verify``, ``inspect``, the lock file and the report.

The contract (docs/start.md, "Tensor names"): an artifact keeps each ONNX name Core ML accepts;
any other gets one deterministic sanitised name, recorded as a renaming, and every edgebuild API
takes and returns the ONNX names. The models are small generated graphs carrying one name of each
class Core ML renames or that a caller could trip on, built with ``edgebuild run --json`` and
checked against onnxruntime.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

LONG_INPUT = "n" * 300  # accepted as is: Core ML sets no length limit
LONG_OUTPUT = "t." * 150  # 300 characters, with punctuation: renamed
INPUTS = {
    # Python keywords and Swift/MIL-looking words Core ML accepts: kept
    "input": "input", "class": "class", "for": "for", "return": "return", "self": "self", "default": "default",
    # words coremltools' NameSanitizer reserves: renamed (it would append "_workaround" on its own)
    "state": "state__2",  # "state_" below is an ONNX name already, so the sanitised one moves on
    "fp16": "fp16_",
    # a leading digit
    "0x": "v_0x", "7": "v_7",
    # punctuation, spaces, unicode
    "a/b:0": "a_b_0_2",  # "a_b_0" below keeps its own name: a valid name is never displaced
    "x.y": "x_y", "a-b": "a_b", "with space": "with_space", "ñame/é": "_ame__",
    LONG_INPUT: LONG_INPUT,
    # names that differ only in case: both kept
    "Case": "Case", "case": "case",
    # valid names equal to the sanitised spelling of another
    "a_b_0": "a_b_0", "state_": "state_",
}
OUTPUTS = {
    "output": "output", "Output": "Output", "bool": "bool_", "0out": "v_0out", "out/put:0": "out_put_0",
    LONG_OUTPUT: "t_" * 150,
    "self": "self_2",  # an input that is also a graph output: Core ML names a tensor once
}
SHAPE = [1, 4]
STATE_INPUTS = {"input": "input", "state": "state_"}
STATE_OUTPUTS = {"output": "output", "present/state:0": "present_state_0"}
RECIPE = {
    "edgebuild": 1,
    "target": {"backend": "coreml", "precision": "float32"},
    "validate": {"samples": 2, "runtimes": ["interpreter"], "thresholds": {"cosine_min": 0.9999}},
}


def _names_model():
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), "weights/W:0")
    outputs = [("Relu", "output"), ("Neg", "Output"), ("Sigmoid", "0out"), ("Tanh", "out/put:0"), ("Abs", LONG_OUTPUT)]
    nodes = [helper.make_node("Concat", list(INPUTS), ["cat:0"], axis=0),
             helper.make_node("MatMul", ["cat:0", "weights/W:0"], ["mm/1"])]
    nodes += [helper.make_node(op, ["mm/1"], [name]) for op, name in outputs]
    nodes.append(helper.make_node("Mul", ["mm/1", "mm/1"], ["bool"]))
    count = len(INPUTS)
    value = {name: [count, 4] for name in OUTPUTS} | {"self": SHAPE}
    graph = helper.make_graph(nodes, "names", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in INPUTS],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, value[n]) for n in OUTPUTS], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _state_model():
    """CausalConvWithState (opset 27): a depthwise causal convolution carrying its state in and out."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 1, 3), "conv.weight")
    node = helper.make_node("CausalConvWithState", ["input", "conv.weight", "", "state"], ["output", "present/state:0"])
    graph = helper.make_graph(
        [node], "stateful",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 6]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4, 2])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 6]),
         helper.make_tensor_value_info("present/state:0", TensorProto.FLOAT, [1, 4, 2])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)], ir_version=10)


def _recipe(name: str, shapes: dict) -> dict:
    return {**RECIPE, "name": name, "source": {"model": f"{name}.onnx", "inputs": {k: {"shape": v} for k, v in shapes.items()}},
            "outputs": {"dir": f"out/{name}"}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import onnx

    work = tmp_path_factory.mktemp("names")
    onnx.save(_names_model(), work / "names.onnx")
    onnx.save(_state_model(), work / "stateful.onnx")
    (work / "names.yaml").write_text(yaml.safe_dump(_recipe("names", {n: SHAPE for n in INPUTS}), allow_unicode=True))
    (work / "stateful.yaml").write_text(yaml.safe_dump(_recipe("stateful", {"input": [1, 4, 6], "state": [1, 4, 2]})))
    done = _edgebuild(work, "run", "names.yaml", "stateful.yaml", "--json")
    assert done.returncode == 0, done.stderr
    variants = {v["recipe"]: v for v in json.loads(done.stdout)["variants"]}
    return work, done, variants


def _edgebuild(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *args], cwd=work, capture_output=True,
                          text=True, env={**os.environ, "EDGEBUILD_CACHE_DIR": str(work / "cache")})


def _feeds(names, shapes, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shapes[name]).astype(np.float32) for name in names}


def _onnxruntime(path: Path, feeds: dict) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


CASES = {
    "names": (INPUTS, OUTPUTS, {n: SHAPE for n in INPUTS}),
    "stateful": (STATE_INPUTS, STATE_OUTPUTS, {"input": [1, 4, 6], "state": [1, 4, 2]}),
}


@pytest.mark.parametrize("recipe", list(CASES))
def test_every_name_class_builds_and_validates(built, recipe):
    _, _, variants = built
    record = variants[recipe]
    assert record["status"] == "built"
    runtimes = record["validation"]["runtimes"]
    assert set(runtimes["interpreter"]["metrics"]) == set(CASES[recipe][1])  # reported by ONNX output names


@pytest.mark.parametrize("recipe", list(CASES))
def test_package_takes_exactly_the_chosen_names(built, recipe):
    import coremltools as ct

    work, _, _ = built
    inputs, outputs, _ = CASES[recipe]
    spec = ct.utils.load_spec(str(work / "out" / recipe / "default" / "model.mlpackage"))
    assert [i.name for i in spec.description.input] == list(inputs.values())
    assert sorted(o.name for o in spec.description.output) == sorted(outputs.values())
    for feature in (*spec.description.input, *spec.description.output):
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", feature.name)
        assert not feature.name.endswith("_workaround")
    described = {f.name: f.shortDescription for f in (*spec.description.input, *spec.description.output)}
    assert described["a_b_0_2" if recipe == "names" else "state_"] in ("ONNX input 'a/b:0'", "ONNX input 'state'")


@pytest.mark.parametrize("recipe", list(CASES))
def test_report_and_lock_list_every_renaming(built, recipe):
    work, done, _ = built
    inputs, outputs, _ = CASES[recipe]
    expected = sorted([("input", o, a) for o, a in inputs.items() if o != a]
                      + [("output", o, a) for o, a in outputs.items() if o != a])
    out = work / "out" / recipe / "default"
    report = json.loads((out / "report.json").read_text())
    assert sorted((r["tensor"], r["onnx"], r["artifact"]) for r in report["renamings"]) == expected
    assert all(r["reason"] for r in report["renamings"])
    lock = json.loads((out / "edgebuild.lock.json").read_text())
    assert sorted((r["tensor"], r["onnx"], r["artifact"]) for r in lock["renamings"]) == expected
    html = (out / "report.html").read_text()
    assert "Renamed inputs and outputs" in html
    assert all(artifact_name in html for _, _, artifact_name in expected)
    for _, onnx_name, artifact_name in expected:
        assert f"{onnx_name!r} -> {artifact_name}" in done.stderr  # the console lists them too


def test_the_reasons_say_why(built):
    work, _, _ = built
    report = json.loads((work / "out" / "names" / "default" / "report.json").read_text())
    reasons = {r["onnx"]: r["reason"] for r in report["renamings"]}
    assert reasons["state"] == reasons["fp16"] == "a word MIL reserves"
    assert reasons["0x"] == "starts with a digit"
    assert reasons["a/b:0"] == "characters outside A-Z a-z 0-9 _"
    assert reasons["self"].startswith("also an input")


@pytest.mark.parametrize("recipe", list(CASES))
def test_inference_session_takes_and_returns_onnx_names(built, recipe):
    from edgebuild.bundle.session import InferenceSession

    work, _, _ = built
    inputs, outputs, shapes = CASES[recipe]
    feeds = _feeds(inputs, shapes, seed=5)
    got = InferenceSession(work / "out" / recipe / "default", native=False).run(feeds)
    want = _onnxruntime(work / f"{recipe}.onnx", feeds)
    assert set(got) == set(outputs) == set(want)
    for name in outputs:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], rtol=1e-4, atol=1e-5)


def test_inference_session_names_a_missing_input_by_its_onnx_name(built):
    from edgebuild.bundle.session import InferenceSession
    from edgebuild.errors import BuildError

    work, _, _ = built
    feeds = _feeds(STATE_INPUTS, CASES["stateful"][2], seed=1)
    del feeds["state"]
    with pytest.raises(BuildError, match=r"input\(s\) 'state' not given"):
        InferenceSession(work / "out" / "stateful" / "default" / "model.mlpackage", native=False).run(feeds)


def test_verify_and_inspect_speak_onnx_names(built):
    work, _, _ = built
    package = str(work / "out" / "stateful" / "default" / "model.mlpackage")
    verified = _edgebuild(work, "verify", package, "--reference", "stateful.onnx", "--samples", "2", "--json")
    assert verified.returncode == 0, verified.stderr
    metrics = next(iter(json.loads(verified.stdout)["runtimes"].values()))["metrics"]
    assert set(metrics) == set(STATE_OUTPUTS)
    inspected = _edgebuild(work, "inspect", package, "--json")
    info = json.loads(inspected.stdout)
    assert info["inputs"] == [{"name": "input", "onnx": "input"}, {"name": "state_", "onnx": "state"}]
    assert {"name": "present_state_0", "onnx": "present/state:0"} in info["outputs"]
    shown = _edgebuild(work, "inspect", package)
    assert "'present/state:0' -> present_state_0" in shown.stdout


def test_artifact_names_are_deterministic_and_distinct():
    from edgebuild_coreml.lowering.names import accepted, artifact_names

    first = artifact_names(INPUTS, OUTPUTS)
    assert first == artifact_names(INPUTS, OUTPUTS) == (INPUTS, OUTPUTS)
    chosen = [*first[0].values(), *first[1].values()]
    assert len(chosen) == len(set(chosen)) and all(accepted(n) for n in chosen)
    # the order of the renamed names does not move a valid one
    assert artifact_names(["a/b", "a_b"], [])[0] == {"a/b": "a_b_2", "a_b": "a_b"}
    assert artifact_names(["", "x"], ["x"]) == ({"": "value", "x": "x"}, {"x": "x_2"})
