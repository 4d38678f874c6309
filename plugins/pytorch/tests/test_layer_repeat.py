"""A deep decoder exported as two layers and grown to its depth is the whole-model export:
node for node (modulo names), and onnxruntime gives the same outputs.

Random-weight 4-layer decoders from the published test configs (edgebuild_testplugin.llm_families).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from edgebuild_pytorch.causal_lm import example_inputs, export_decoder, from_config, input_names  # noqa: E402
from edgebuild_pytorch.layer_repeat import repeatable  # noqa: E402
from edgebuild_pytorch.onnx_route import save_model  # noqa: E402
from edgebuild_testplugin import llm_families  # noqa: E402

LAYERS = 4
FAMILIES = ["llama", pytest.param("qwen2", marks=pytest.mark.slow), pytest.param("phi3", marks=pytest.mark.slow),
            pytest.param("gpt2", marks=pytest.mark.slow)]


def deep_model(family: str, tmp_path, layers: int = LAYERS):
    config = dict(llm_families.CONFIGS[family])
    config["n_layer" if family == "gpt2" else "num_hidden_layers"] = layers
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    torch.manual_seed(0)
    return from_config(str(path)).eval()


def canonical(graph) -> list:
    """The graph as nodes in order, each value named by what makes it: graph input i, an
    initializer's dtype/shape/content, or (node j, output k). A ``Shape`` of a cache input is of
    "a cache input": the exporter reads the batch and past dims from whichever it met first, and
    every cache input has them."""
    refs = {id(v): ("input", i) for i, v in enumerate(graph.inputs)}
    cache = {id(v) for v in graph.inputs if v.name.startswith("past_key_values.")}
    for value in graph.initializers.values():
        array = value.const_value.numpy()
        refs[id(value)] = ("init", str(array.dtype), array.shape, hashlib.sha256(array.tobytes()).hexdigest())
    nodes = []
    for j, node in enumerate(graph):
        attributes = sorted((name, repr(_attribute(attr))) for name, attr in node.attributes.items())
        inputs = [None if v is None else ("cache",) if node.op_type == "Shape" and id(v) in cache else refs[id(v)]
                  for v in node.inputs]
        nodes.append((node.domain, node.op_type, attributes, inputs))
        for k, value in enumerate(node.outputs):
            refs[id(value)] = ("node", j, k)
    return nodes + [("outputs", [refs[id(v)] for v in graph.outputs], [v.name for v in graph.outputs],
                     [v.name for v in graph.inputs])]


def _attribute(attr):
    value = attr.value
    return value.numpy().tolist() if hasattr(value, "numpy") else value


@pytest.mark.parametrize("family", FAMILIES)
def test_grown_graph_is_the_whole_export(family, tmp_path, monkeypatch):
    from edgebuild_pytorch import layer_repeat

    model = deep_model(family, tmp_path)
    assert repeatable(model)
    grew = []
    repeat = layer_repeat.repeat_layers
    monkeypatch.setattr(layer_repeat, "repeat_layers", lambda *a, **k: grew.append(repeat(*a, **k)) or grew[-1])
    grown = export_decoder(model, repeat=True)
    assert grew == [True]
    whole = export_decoder(model, repeat=False)
    assert len(list(grown.graph)) == len(list(whole.graph))
    assert canonical(grown.graph) == canonical(whole.graph)

    save_model(grown, tmp_path / "grown" / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "grown" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {name: t.numpy() for name, t in zip(input_names(model), example_inputs(model))}
    got = session.run(None, feeds)
    with torch.no_grad():
        from edgebuild_pytorch.causal_lm import cache_io

        want = cache_io(model)(*example_inputs(model))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)


def test_layers_of_two_kinds_are_exported_whole(tmp_path):
    """Gemma-2 alternates sliding-window and global layers: no single layer repeats."""
    assert not repeatable(deep_model("gemma2", tmp_path))


def test_two_layers_are_exported_whole(tmp_path):
    assert not repeatable(deep_model("llama", tmp_path, layers=2))
