"""The test plugin's tiny Llama (llm_families: random weights, transformers' architecture) exported
by the PyTorch plugin with an explicit KV cache, built by ``edgebuild run`` from a generative recipe into stateful packages (fp32, fp16),
and checked against onnxruntime on the source: a cache round trip and greedy generation."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

ct = pytest.importorskip("coremltools")
pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from edgebuild.bundle.session import InferenceSession  # noqa: E402
from edgebuild.errors import BuildError  # noqa: E402
from edgebuild_testplugin.cli_runner import edgebuild  # noqa: E402
from edgebuild_testplugin import llm_families  # noqa: E402

from edgebuild.verify.source_generation import OnnxGenerator  # noqa: E402

pytestmark = pytest.mark.slow  # an export and three builds: about a minute and a half

MAX_CONTEXT = 128
LLAMA = llm_families.CONFIGS["llama"]
RECIPE = """\
edgebuild: 1
name: tinyllama
source:
  model: model.onnx
target: {{backend: coreml, deployment_target: {target}, precision: float32}}
compute: {{policy: cpu_only}}
generate:
  max_context: {max_context}
  query_lengths: [1, 16, 64]
{extra}
variants:
  fp32: {{}}
  fp16: {{target: {{precision: float16}}}}
  last: {{generate: {{logits: last_token, query_lengths: {{range: [1, 64]}}}}}}
outputs: {{dir: out}}
"""


def _recipe(directory, name="recipe.yaml", target="iOS18", max_context=MAX_CONTEXT, extra=""):
    path = directory / name
    path.write_text(RECIPE.format(target=target, max_context=max_context, extra=extra))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    directory = tmp_path_factory.mktemp("decoder")
    decoder = llm_families.onnx_decoder("llama")
    for path in decoder.parent.iterdir():  # model.onnx and its weights, model.onnx.data
        shutil.copy(path, directory / path.name)
    env = {"EDGEBUILD_CACHE_DIR": str(directory / "cache")}
    edgebuild("run", _recipe(directory), env=env, cwd=directory, check=0)
    return directory


def source_logits(built, ids):
    """onnxruntime's logits [Q, V] for ``ids`` fed in one run to an empty cache."""
    generator = OnnxGenerator(built / "model.onnx")
    return generator.step(ids, 0, dict(generator.empty_past))[0]


def _cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_package_has_states_and_two_inputs(built, variant):
    spec = ct.utils.load_spec(str(built / "out" / variant / "model.mlpackage"))
    description = spec.description
    assert [i.name for i in description.input] == ["input_ids", "position"]
    assert [o.name for o in description.output] == ["logits"]
    states = {s.name: list(s.type.stateType.arrayType.shape) for s in description.state}
    heads, dim = LLAMA["num_key_value_heads"], LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
    assert states == {f"past_key_values_{i}_{kind}": [1, heads, MAX_CONTEXT, dim]
                      for i in range(LLAMA["num_hidden_layers"]) for kind in ("key", "value")}
    ids = description.input[0].type.multiArrayType
    assert sorted(shape.shape[1] for shape in ids.enumeratedShapes.shapes) == [1, 16, 64]
    generate = json.loads(description.metadata.userDefined["edgebuild.generate"])
    assert generate["max_context"] == MAX_CONTEXT and generate["query_lengths"] == [1, 16, 64]
    assert generate["states"][0] == {"name": "past_key_values_0_key", "input": "past_key_values.0.key",
                                     "output": "present.0.key"}


@pytest.mark.parametrize("variant, cosine_min, agreement_min", [("fp32", 0.9999, 1.0), ("fp16", 0.999, 0.95)])
def test_prefill_then_decode_equals_one_forward(built, variant, cosine_min, agreement_min):
    """Prefill 64 tokens, then 16 one-token steps through the state = one 80-token onnxruntime forward."""
    ids = [int(t) for t in np.random.default_rng(1).integers(0, LLAMA["vocab_size"], 80)]
    session = InferenceSession(built / "out" / variant)
    logits = [session.run({"input_ids": np.array([ids[:64]])})["logits"][0]]
    assert session.position == 64
    for token in ids[64:]:
        logits.append(session.run({"input_ids": np.array([[token]])})["logits"][0])
    assert session.position == 80
    got = np.concatenate(logits)
    want = source_logits(built, ids)
    cosines = _cosines(got, want)
    assert cosines.min() >= cosine_min, cosines.min()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= agreement_min


def test_generate_equals_onnxruntime_greedy(built):
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, LLAMA["vocab_size"], 21)]
    session = InferenceSession(built / "out" / "fp32")
    tokens, logits = session.generate(prompt, 16, return_logits=True)
    want_tokens, want_logits = OnnxGenerator(built / "model.onnx").generate(prompt, 16)
    assert tokens == want_tokens
    assert logits.shape == (16, LLAMA["vocab_size"])
    assert _cosines(logits, want_logits).min() >= 0.9999
    assert session.position == len(prompt) + 15  # the last token is chosen, not fed
    assert session.generate(prompt, 16) == tokens  # generate() starts from an empty cache


def test_last_token_logits_over_a_range_of_query_lengths(built):
    """logits: last_token returns [1, 1, V]; a range of query lengths takes any chunk up to 64."""
    spec = ct.utils.load_spec(str(built / "out" / "last" / "model.mlpackage"))
    ranges = spec.description.input[0].type.multiArrayType.shapeRange.sizeRanges
    assert (ranges[1].lowerBound, ranges[1].upperBound) == (1, 64)
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, LLAMA["vocab_size"], 37)]
    session = InferenceSession(built / "out" / "last")
    last = session.run({"input_ids": np.array([prompt])})["logits"]
    assert last.shape == (1, 1, LLAMA["vocab_size"])
    want = source_logits(built, prompt)
    assert _cosines(last[0, 0], want[-1]) >= 0.9999
    tokens = session.generate(prompt, 8)
    assert tokens == OnnxGenerator(built / "model.onnx").generate(prompt, 8)[0]


def test_context_overflow_names_max_context(built):
    session = InferenceSession(built / "out" / "fp32")
    with pytest.raises(BuildError, match=f"120 new tokens .* exceed max_context {MAX_CONTEXT}"):
        session.generate(list(range(20)), 120)
    session.run({"input_ids": np.zeros((1, 64), np.int64), "position": np.array([64])})
    with pytest.raises(BuildError, match=f"tokens 128..144 do not fit the cache of max_context {MAX_CONTEXT}"):
        session.run({"input_ids": np.zeros((1, 16), np.int64)})


@pytest.mark.parametrize("kwargs, phrases", [
    ({"target": "iOS17"}, ["target.deployment_target", "generate", "iOS18"]),
    ({"extra": "  cache: [{input: past_key_values.0.kye, output: present.0.key}]"},
     ["generate.cache.0.input", "'past_key_values.0.kye'", "its inputs are input_ids, attention_mask"]),
    ({"max_context": 32}, ["generate", "query length 64 exceeds max_context 32"]),
])
def test_recipe_errors_exit_2_without_traceback(built, kwargs, phrases):
    done = edgebuild("run", _recipe(built, "bad.yaml", **kwargs), cwd=built,
                     env={"EDGEBUILD_CACHE_DIR": str(built / "cache")})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    for phrase in phrases:
        assert phrase in done.stderr, done.stderr
