"""Causal LMs as sources: the KV-cache export, and greedy generation with the source.

Tiny random-weight decoders of five families (edgebuild_testplugin.llm_families). Llama runs
in the default suite; the other families, and everything that exports a second graph, are slow.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from edgebuild_pytorch.causal_lm import input_names, output_names  # noqa: E402
from edgebuild_pytorch.frontend import PyTorchFrontend  # noqa: E402
from edgebuild_pytorch.generation import TorchGenerator  # noqa: E402
from edgebuild_pytorch.loading import load_source  # noqa: E402
from edgebuild_pytorch.options import PyTorchOptions  # noqa: E402
from edgebuild_testplugin import llm_families  # noqa: E402

from edgebuild.errors import BuildError, UsageError  # noqa: E402
from edgebuild.verify.source_generation import OnnxGenerator, pair_cache  # noqa: E402

COSINE_MIN = 0.99999
STEP_COSINE_MIN = 0.9999
NEW_TOKENS = 8
# The first is longer than Gemma-2's sliding window (8), so its windowed layers drop tokens.
PROMPTS = [[1, 17, 93, 5, 42, 250, 7, 11, 64, 3, 99, 120], [1, 200]]

SLOW = ("qwen2", "phi3", "gemma2", "gpt2")
FAMILIES = [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in llm_families.FAMILIES]
GENAI = [pytest.param(f, marks=pytest.mark.slow) for f in llm_families.GENAI_FAMILIES]


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def source_model(family: str):
    weights = llm_families.checkpoint(family) / "model.safetensors"
    return load_source(weights, PyTorchOptions(kind="causal_lm")).module


def onnx_session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_decoder_matches_eager_prefill_and_decode(family):
    model = source_model(family)
    session = onnx_session(llm_families.onnx_decoder(family))
    names = [i.name for i in session.get_inputs()]
    assert names == input_names(model)
    assert [o.name for o in session.get_outputs()] == output_names(model)
    layers = (len(names) - names.index("past_key_values.0.key")) // 2
    empty = session.get_inputs()[names.index("past_key_values.0.key")]
    prompt, next_token = PROMPTS[0], 77

    def feeds(ids, position, past):
        feed = {"input_ids": np.array([ids], np.int64),
                "attention_mask": np.ones((1, position + len(ids)), np.int64), **past}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(position, position + len(ids), dtype=np.int64)[None]
        return feed

    zeros = np.zeros((1, empty.shape[1], 0, empty.shape[3]), np.float32)
    past = {f"past_key_values.{i}.{p}": zeros for i in range(layers) for p in ("key", "value")}
    prefill = dict(zip(output_names(model), session.run(None, feeds(prompt, 0, past))))
    past = {f"past_key_values.{i}.{p}": prefill[f"present.{i}.{p}"] for i in range(layers) for p in ("key", "value")}
    decode = dict(zip(output_names(model), session.run(None, feeds([next_token], len(prompt), past))))

    with torch.no_grad():
        eager_prefill = model(input_ids=torch.tensor([prompt]), use_cache=True)
        eager_decode = model(input_ids=torch.tensor([[next_token]]), past_key_values=eager_prefill.past_key_values,
                             use_cache=True)
    assert prefill["present.0.key"].shape[2] == len(prompt)
    assert decode["present.0.key"].shape[2] == len(prompt) + 1
    assert cosine(prefill["logits"], eager_prefill.logits.numpy()) >= COSINE_MIN
    assert cosine(decode["logits"], eager_decode.logits.numpy()) >= COSINE_MIN


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_and_torch_generators_agree(family):
    reference = TorchGenerator(source_model(family))
    candidate = OnnxGenerator(llm_families.onnx_decoder(family))
    for prompt in PROMPTS:
        torch_tokens, torch_logits = reference.generate(prompt, NEW_TOKENS)
        onnx_tokens, onnx_logits = candidate.generate(prompt, NEW_TOKENS)
        assert onnx_tokens == torch_tokens
        assert onnx_logits.shape == torch_logits.shape == (NEW_TOKENS, source_model(family).config.vocab_size)
        assert min(cosine(a, b) for a, b in zip(onnx_logits, torch_logits)) >= STEP_COSINE_MIN


@pytest.mark.parametrize("family", llm_families.FAMILIES)
def test_torch_generator_is_greedy_generate(family):
    """The reference is what transformers' own greedy ``generate`` produces (its cache, its masks)."""
    model = source_model(family)
    prompt = PROMPTS[0]
    tokens, logits = TorchGenerator(model).generate(prompt, NEW_TOKENS)
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False, pad_token_id=0)
    assert tokens == expected[0, len(prompt):].tolist()
    assert logits.shape == (NEW_TOKENS, model.config.vocab_size)
    assert [int(np.argmax(row)) for row in logits] == tokens


def test_tied_output_projection_loads_from_a_checkpoint_that_saves_it_once():
    model = source_model("gpt2")  # built on the meta device, given the file's tensors
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not model.lm_head.weight.is_meta and model.lm_head.weight.data_ptr() != 0


def test_causal_lm_refuses_the_coreml_route():
    with pytest.raises(ValueError, match="causal_lm is exported through ONNX"):
        PyTorchOptions(kind="causal_lm", route="coreml")


def test_frontend_gives_a_generator_for_causal_lms_only(tmp_path):
    weights = llm_families.checkpoint("llama") / "model.safetensors"
    frontend = PyTorchFrontend()
    assert isinstance(frontend.generator(weights, PyTorchOptions(kind="causal_lm")), TorchGenerator)
    assert frontend.reference(weights, {}, PyTorchOptions(kind="causal_lm")) is None


@pytest.mark.slow
def test_frontend_imports_a_causal_lm_checkpoint(tmp_path):
    import onnx

    weights = llm_families.checkpoint("qwen2") / "model.safetensors"
    report = PyTorchFrontend().import_model(weights, {}, tmp_path, options={"kind": "causal_lm"})
    assert (report["kind"], report["route"], report["architecture"]) == ("causal_lm", "onnx", "Qwen2ForCausalLM")
    graph = onnx.load(tmp_path / "model.onnx", load_external_data=False).graph
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert dims["input_ids"] == ["batch", "query_length"]
    assert dims["attention_mask"] == ["batch", "total_length"]
    assert dims["past_key_values.1.value"] == ["batch", 2, "past_length", 16]
    out = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    assert out["logits"] == ["batch", "query_length", 320]
    tokens, _ = OnnxGenerator(tmp_path / "model.onnx").generate(PROMPTS[1], 4)
    assert tokens == TorchGenerator(source_model("qwen2")).generate(PROMPTS[1], 4)[0]


@pytest.mark.parametrize("family", GENAI)
def test_genai_decoder_agrees_with_torch(family):
    import onnx

    pytest.importorskip("onnxruntime_genai")

    path = llm_families.genai_decoder(family)
    ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= ops
    reference = TorchGenerator(source_model(family))
    candidate = OnnxGenerator(path)
    for prompt in PROMPTS:
        torch_tokens, torch_logits = reference.generate(prompt, NEW_TOKENS)
        genai_tokens, genai_logits = candidate.generate(prompt, NEW_TOKENS)
        assert genai_tokens == torch_tokens
        assert min(cosine(a, b) for a, b in zip(genai_logits, torch_logits)) >= STEP_COSINE_MIN


@pytest.mark.slow
def test_genai_int4_decoder_runs_with_matmulnbits():
    import onnx

    pytest.importorskip("onnxruntime_genai")

    path = llm_families.genai_decoder("llama", "int4")
    ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    assert {"MatMulNBits", "GroupQueryAttention"} <= ops
    tokens, logits = OnnxGenerator(path).generate(PROMPTS[0], NEW_TOKENS)
    _, reference = TorchGenerator(source_model("llama")).generate(PROMPTS[0], 1)
    assert len(tokens) == NEW_TOKENS and np.isfinite(logits).all()
    assert cosine(logits[0], reference[0]) >= 0.98  # 4-bit weights: close, not equal


def test_cache_pairs_by_name_and_unpaired_inputs_are_named():
    assert pair_cache(["input_ids", "past_key_values.0.key"], ["logits", "present.0.key"]) == [
        ("past_key_values.0.key", "present.0.key")]
    with pytest.raises(BuildError, match="'past_key_values.0.value' has no output 'present.0.value'"):
        pair_cache(["past_key_values.0.value"], ["logits", "present.0.key"])


def test_onnx_generator_refuses_an_empty_prompt():
    with pytest.raises(UsageError, match="at least one token"):
        OnnxGenerator(llm_families.onnx_decoder("llama")).generate([], 2)


def _variant(model: str, fmt: str | None, options: PyTorchOptions | None):
    from types import SimpleNamespace

    source = SimpleNamespace(model=model, format=fmt)
    return SimpleNamespace(recipe=SimpleNamespace(source=source, generate=None), base_dir=None, data={},
                           section=lambda name: options if name == "pytorch:source.options" else None)


def test_the_source_generator_is_the_frontends_else_onnxruntime():
    from edgebuild.registry import get_registry
    from edgebuild.dag.validate import source_generator

    weights = llm_families.checkpoint("llama") / "model.safetensors"
    variant = _variant(str(weights), "pytorch", PyTorchOptions(kind="causal_lm"))
    generator, name = source_generator(get_registry(), variant, weights)
    assert (type(generator), name) == (TorchGenerator, "pytorch (eager)")
    decoder = llm_families.onnx_decoder("llama")
    generator, name = source_generator(get_registry(), _variant(str(decoder), None, None), decoder)
    assert (type(generator), name) == (OnnxGenerator, "onnxruntime")


@pytest.mark.parametrize("held", ["copy", "reference"])
def test_import_keeps_the_checkpoint_as_its_weight_file(tmp_path, monkeypatch, held):
    """The exported weights point into the safetensors file (nn.Linear's read through a Transpose),
    instead of being written again: a copy of it, or for a large one a reference to it (the
    threshold lowered here), and the decoder still generates as the source."""
    import filecmp
    import os

    import onnx

    from edgebuild.store import links

    if held == "reference":
        monkeypatch.setattr(links, "REFERENCE_MIN_BYTES", 0)
    weights = llm_families.checkpoint("llama") / "model.safetensors"
    PyTorchFrontend().import_model(weights, {}, tmp_path, options={"kind": "causal_lm"})
    data = tmp_path / "model.onnx.data"
    assert data.is_symlink() == (held == "reference")
    assert os.path.realpath(data) == os.path.realpath(weights) if held == "reference" else \
        filecmp.cmp(weights, data, shallow=False)
    graph = onnx.load(tmp_path / "model.onnx", load_external_data=False).graph
    location = {t.name: dict((e.key, e.value) for e in t.external_data)["location"]
                for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    read_transposed = {n.input[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] in location}
    assert read_transposed and {location[name] for name in read_transposed} == {"model.onnx.data"}
    assert sum(1 for where in location.values() if where == "model.onnx.data") > len(read_transposed)
    if held == "reference":  # onnxruntime refuses a data file outside the model's folder; stages map it
        from edgebuild.graph.weight_files import load_stage_model

        tensors = {v.name: v.const_value for v in load_stage_model(tmp_path / "model.onnx").graph.initializers.values()}
        state = source_model("llama").state_dict()  # initializers: the wrapper's "model." + the module's names
        for name in read_transposed:
            np.testing.assert_array_equal(tensors[name].numpy(), state[name.removeprefix("model.")].numpy())
        return
    tokens, _ = OnnxGenerator(tmp_path / "model.onnx").generate(PROMPTS[1], 4)
    assert tokens == TorchGenerator(source_model("llama")).generate(PROMPTS[1], 4)[0]


def test_weights_changed_in_memory_are_written_not_referenced(tmp_path):
    from edgebuild_pytorch.causal_lm import export_decoder
    from edgebuild_pytorch.file_weights import reference_file_weights

    weights = llm_families.checkpoint("llama") / "model.safetensors"
    model = load_source(weights, PyTorchOptions(kind="causal_lm")).module
    exported = export_decoder(model)
    with torch.no_grad():
        next(model.parameters()).mul_(1.0)  # a write: the mapping's page is a private copy now
    assert reference_file_weights(exported.graph, weights) == 0
    assert not any(n.op_type == "Transpose" and n.name.endswith("__read") for n in exported.graph)
