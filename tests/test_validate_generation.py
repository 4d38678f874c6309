"""Validation by generation: the test plugin's tiny random-weight Llama (llm_families), exported by the
PyTorch plugin with an explicit KV cache, run greedily by onnxruntime (OnnxGenerator), compared with
itself and with altered copies of its weights."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from edgebuild.errors import BuildError
from edgebuild.recipe.validation import ValidateSection
from edgebuild.verify.generation import (
    GenerationLimits,
    check_generation,
    compare_generation,
    generation_limits,
    generation_record,
    prompt_ids,
)
from edgebuild.verify.source_generation import OnnxGenerator
from edgebuild_testplugin.llm_families import CONFIGS

PROMPTS = [[1, 15, 200, 7], [1, 90]]
VOCAB = CONFIGS["llama"]["vocab_size"]
NEW_TOKENS = 12


# -- the tiny Llama of the test plugin's families, exported by the PyTorch plugin ----------------

def tiny_llama():
    """The random-weight Llama the exported decoder holds (torch and transformers needed)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from edgebuild_testplugin import llm_families

    return llm_families.model("llama")


class Session:
    """InferenceSession's generation surface (reset, generate with return_logits) over a generator."""

    def __init__(self, generator):
        self.generator, self.resets = generator, 0

    def reset(self):
        self.resets += 1

    def generate(self, prompt_ids, max_new_tokens, *, return_logits=False):
        tokens, logits = self.generator.generate(prompt_ids, max_new_tokens)
        return (tokens, logits) if return_logits else tokens


def with_weights(source: Path, path: Path, change) -> Path:
    """A copy of ``source`` with every float initializer replaced by ``change(array)``."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    for initializer in model.graph.initializer:
        array = numpy_helper.to_array(initializer)
        if array.dtype == np.float32 and array.size > 1:
            initializer.CopyFrom(numpy_helper.from_array(change(array).astype(np.float32), initializer.name))
    onnx.save(model, str(path))
    return path


def copy_decoder(source: Path, path: Path) -> Path:
    """The decoder at ``path``, its weights file (named in the graph) beside it."""
    import shutil

    shutil.copy(source, path)
    for data in source.parent.glob(source.name + ".data"):
        shutil.copy(data, path.parent / data.name)
    return path


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """The source decoder; its weights rounded through float16; a copy with perturbed weights."""
    for needed in ("torch", "transformers", "onnxruntime", "edgebuild_pytorch"):
        pytest.importorskip(needed)
    from edgebuild_testplugin import llm_families

    folder = tmp_path_factory.mktemp("decoders")
    source = llm_families.onnx_decoder("llama")
    noise = np.random.default_rng(1)
    return {"source": source,
            "fp16_rounded": with_weights(source, folder / "fp16_rounded.onnx", lambda w: w.astype(np.float16)),
            "perturbed": with_weights(source, folder / "perturbed.onnx",
                                      lambda w: w + 0.002 * noise.standard_normal(w.shape))}


# -- compare_generation ------------------------------------------------------------------------

def test_a_decoder_against_itself_agrees_on_every_token(decoders):
    result = compare_generation(OnnxGenerator(decoders["source"]), OnnxGenerator(decoders["source"]), PROMPTS, NEW_TOKENS)
    assert result.mean_agreement == 1.0 and result.first_divergence is None
    assert result.worst_step_cosine > 0.999999
    for prompt in result.prompts:
        assert prompt.artifact_tokens == prompt.source_tokens and len(prompt.artifact_tokens) == NEW_TOKENS
        assert len(prompt.step_cosine) == NEW_TOKENS  # no divergence: every step compared
    assert check_generation(result, generation_limits({"cosine_min": 0.9999})) == []


def test_onnxruntime_generation_follows_the_eager_model(decoders):
    """The reference itself: the exported graph with its cache greedy-decodes as transformers does."""
    import torch

    model = tiny_llama()
    prompt = PROMPTS[0]
    tokens, logits = OnnxGenerator(decoders["source"]).generate(prompt, 6)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    assert out.sequences[0, len(prompt):].tolist() == tokens
    eager = torch.cat(out.logits).numpy()
    assert np.allclose(logits, eager, atol=1e-4)


def test_float16_rounded_weights_stay_close_until_they_diverge(decoders):
    result = compare_generation(OnnxGenerator(decoders["fp16_rounded"]), OnnxGenerator(decoders["source"]), PROMPTS,
                                NEW_TOKENS)
    assert result.worst_step_cosine > 0.999  # weights rounded to fp16: close logits at every compared step
    for prompt in result.prompts:
        compared = NEW_TOKENS if prompt.first_divergence is None else prompt.first_divergence + 1
        assert len(prompt.step_cosine) == compared


def test_a_perturbed_copy_diverges_and_fails_naming_metric_prompt_and_step(decoders):
    result = compare_generation(OnnxGenerator(decoders["perturbed"]), OnnxGenerator(decoders["source"]), PROMPTS,
                                NEW_TOKENS)
    assert result.first_divergence is not None and result.mean_agreement < 1.0
    diverged = [p for p in result.prompts if p.first_divergence is not None]
    for prompt in diverged:
        step = prompt.first_divergence
        assert prompt.artifact_tokens[:step] == prompt.source_tokens[:step]
        assert prompt.artifact_tokens[step] != prompt.source_tokens[step]
        assert len(prompt.step_cosine) == step + 1  # compared up to and including the first divergence
        assert prompt.agreement == sum(a == b for a, b in zip(prompt.artifact_tokens, prompt.source_tokens)) / NEW_TOKENS

    failures = check_generation(result, GenerationLimits(token_agreement_min=1.0, step_cosine_min=0.99999))
    agreement = [f for f in failures if f["metric"] == "token_agreement"]
    assert len(agreement) == len(diverged)
    first = agreement[0]
    index = result.prompts.index(diverged[0])
    assert first["prompt"] == index and first["step"] == diverged[0].first_divergence
    assert f"prompt {index}" in first["message"] and f"step {first['step']}" in first["message"]
    assert "token_agreement" in first["message"] and first["limit"] == 1.0
    cosine = [f for f in failures if f["metric"] == "step_cosine"]
    assert cosine and all(re.search(r"prompt \d+: step_cosine [\d.]+ < step_cosine_min", f["message"]) for f in cosine)

    # a lower agreement limit, as an fp16 or compressed variant sets one, lets the same run pass on tokens
    lenient = check_generation(result, GenerationLimits(token_agreement_min=0.0, step_cosine_min=None))
    assert lenient == []


def test_limits_default_to_full_agreement_and_the_recipes_cosine():
    assert generation_limits(None) == GenerationLimits(1.0, None)
    assert generation_limits({"cosine_min": 0.999}) == GenerationLimits(1.0, 0.999)
    section = ValidateSection.model_validate({
        "generation": {"prompts": [[1, 2]]},
        "thresholds": {"cosine_min": 0.99, "step_cosine_min": 0.9, "token_agreement_min": 0.75}})
    assert generation_limits(section.thresholds) == GenerationLimits(0.75, 0.9)


def test_a_generator_returning_the_wrong_length_is_a_clear_error(decoders):
    class Short:
        def generate(self, prompt_ids, new_tokens):
            return [0], np.zeros((1, VOCAB), np.float32)

    with pytest.raises(BuildError, match=r"the artifact generated 1 tokens .* expected 4 tokens"):
        compare_generation(Short(), OnnxGenerator(decoders["source"]), [[1, 2]], 4)


# -- the recipe --------------------------------------------------------------------------------

def test_recipe_generation_section():
    section = ValidateSection.model_validate({"generation": {"prompts": [[1, 15043, 29892], [1, 450]], "new_tokens": 8}})
    assert section.generation.prompts == [[1, 15043, 29892], [1, 450]] and section.generation.new_tokens == 8
    texts = ValidateSection.model_validate({"generation": {"prompts": {"tokenizer": "tokenizer.json", "texts": ["hi"]}}})
    assert texts.generation.prompts.tokenizer == "tokenizer.json" and texts.generation.new_tokens == 16
    for bad, where in [({"prompts": []}, "prompts"), ({"prompts": [[]]}, "prompts"), ({"prompts": [[-1]]}, "prompts"),
                       ({"prompts": [[1]], "new_tokens": 0}, "new_tokens"), ({"prompts": [[1]], "new_token": 3}, "new_token")]:
        with pytest.raises(ValidationError, match=where):
            ValidateSection.model_validate({"generation": bad})


def test_generation_limits_need_validate_generation():
    with pytest.raises(ValidationError, match=r"thresholds.token_agreement_min limits generation validation"):
        ValidateSection.model_validate({"thresholds": {"token_agreement_min": 0.9}})
    with pytest.raises(ValidationError, match=r"per_output.logits.thresholds.step_cosine_min"):
        ValidateSection.model_validate({"generation": {"prompts": [[1]]},
                                        "per_output": {"logits": {"thresholds": {"step_cosine_min": 0.9}}}})
    with pytest.raises(ValidationError, match="token_agreement_min"):
        ValidateSection.model_validate({"generation": {"prompts": [[1]]}, "thresholds": {"token_agreement_min": 1.5}})


# -- tokenizer prompts -------------------------------------------------------------------------

def tiny_tokenizer(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tokenizer = tokenizers.Tokenizer(WordLevel({w: i + 3 for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path))
    return path


def test_tokenizer_prompts_become_token_ids(tmp_path):
    tiny_tokenizer(tmp_path / "tokenizer.json")
    section = ValidateSection.model_validate(
        {"generation": {"prompts": {"tokenizer": "tokenizer.json", "texts": ["the cat sat", "a dog on the mat"]}}})
    ids, texts = prompt_ids(section.generation, tmp_path)
    assert ids == [[4, 5, 6], [9, 10, 7, 4, 8]] and texts == ["the cat sat", "a dog on the mat"]


def test_tokenizer_errors_name_the_field(tmp_path):
    section = ValidateSection.model_validate(
        {"generation": {"prompts": {"tokenizer": "missing.json", "texts": ["the cat"]}}})
    with pytest.raises(BuildError, match=r"validate.generation.prompts.tokenizer: no such file \('missing.json'"):
        prompt_ids(section.generation, tmp_path)
    (tmp_path / "broken.json").write_text("{}")
    broken = ValidateSection.model_validate({"generation": {"prompts": {"tokenizer": "broken.json", "texts": ["x"]}}})
    with pytest.raises(BuildError, match="is not a tokenizer.json"):
        prompt_ids(broken.generation, tmp_path)


def test_tokenizer_file_is_a_validation_input(tmp_path):
    from edgebuild.verify.files import digest_params

    tiny_tokenizer(tmp_path / "tokenizer.json")
    section = ValidateSection.model_validate(
        {"generation": {"prompts": {"tokenizer": "tokenizer.json", "texts": ["the cat"]}}})
    assert list(digest_params(section, tmp_path)["input_files"]) == ["tokenizer.json"]


# -- the validate stage and the report ---------------------------------------------------------

def _variant(tmp_path: Path, validate: dict, generate: dict | None = None):
    recipe = SimpleNamespace(validate_=ValidateSection.model_validate(validate), source=None)
    return SimpleNamespace(recipe=recipe, data={"generate": generate or {"max_context": 64}}, path=tmp_path / "r.yaml",
                           base_dir=tmp_path)


def test_validate_stage_record_with_tokenizer_prompts_passes(decoders, tmp_path):
    from edgebuild.dag.validate import validate_generation
    from edgebuild.report.schema import Validation

    tiny_tokenizer(tmp_path / "tokenizer.json")
    variant = _variant(tmp_path, {"generation": {"prompts": {"tokenizer": "tokenizer.json",
                                                             "texts": ["the cat sat", "a dog"]}, "new_tokens": 6},
                                  "thresholds": {"cosine_min": 0.9999}})
    session = Session(OnnxGenerator(decoders["source"]))
    record = validate_generation(variant, None, decoders["source"], {"interpreter": lambda: session},
                                 source=(OnnxGenerator(decoders["source"]), "onnxruntime"))
    assert session.resets == 2  # each prompt starts from an empty cache
    assert record["failures"] == [] and record["samples"] == 2
    runtime = record["runtimes"]["interpreter"]
    assert runtime["limits"] == {"logits": {"token_agreement_min": 1.0, "step_cosine_min": 0.9999}}
    assert runtime["generation"]["prompts"][0]["text"] == "the cat sat"
    assert runtime["generation"]["prompts"][0]["prompt"] == [4, 5, 6]
    parsed = Validation.model_validate(json.loads(json.dumps(record)))
    assert parsed.runtimes["interpreter"].generation.mean_agreement == 1.0


def test_validate_stage_failure_reaches_the_report_and_its_plot(decoders, tmp_path):
    from edgebuild.dag.validate import validate_generation
    from edgebuild.report.console import generation_lines
    from edgebuild.report.html import render_report
    from edgebuild.report.schema import Report
    from edgebuild.report.write import to_jsonable

    variant = _variant(tmp_path, {"generation": {"prompts": PROMPTS, "new_tokens": NEW_TOKENS}})
    record = validate_generation(variant, None, decoders["source"],
                                 {"interpreter": lambda: Session(OnnxGenerator(decoders["perturbed"]))},
                                 source=(OnnxGenerator(decoders["source"]), "onnxruntime"))
    failures = record["failures"]
    assert failures and failures[0]["runtime"] == "interpreter" and failures[0]["metric"] == "token_agreement"
    assert {"prompt", "step"} <= set(failures[0])

    report = Report.model_validate(to_jsonable({"recipe": "tiny", "variant": "fp32", "status": "failed",
                                                "validation": record}))
    assert report.failures and report.failures[0].prompt is not None
    page = render_report(report)
    chart = re.search(r'<svg class="chart"[^>]*>(?:(?!</svg>).)*1 − cosine of the step&#x27;s logits.*?</svg>', page)
    assert chart, "the per-step cosine plot is on the page"
    assert len(re.findall(r'<polyline class="series', chart.group(0))) == len(PROMPTS)  # one series per prompt
    assert 'class="divergence"' in chart.group(0)  # the first divergence is marked
    assert "token_agreement" in page and "first divergence" in page

    from edgebuild.build.run import _validation_failures  # what run --json and report.json list

    build = SimpleNamespace(job=SimpleNamespace(results={"validate": SimpleNamespace(info=to_jsonable(record))}))
    listed = _validation_failures(build)
    assert listed[0]["prompt"] == failures[0]["prompt"] and listed[0]["step"] == failures[0]["step"]

    line = generation_lines(SimpleNamespace(info=to_jsonable(record)))
    assert len(line) == 1 and "generation (interpreter)" in line[0] and "first divergence at step" in line[0]


def test_missing_generation_section_and_context_overflow_are_clear(decoders, tmp_path):
    from edgebuild.dag.validate import validate_generation

    source = (OnnxGenerator(decoders["source"]), "onnxruntime")
    plain = _variant(tmp_path, {"samples": 2})
    with pytest.raises(BuildError, match="validate.generation is missing"):
        validate_generation(plain, None, decoders["source"], {}, source=source)
    long = _variant(tmp_path, {"generation": {"prompts": [[1] * 10], "new_tokens": 8}}, {"max_context": 16})
    with pytest.raises(BuildError, match=r"plus new_tokens \(8\) exceeds generate.max_context \(16\)"):
        validate_generation(long, None, decoders["source"], {}, source=source)


def test_record_statistics_from_a_comparison(decoders):
    result = compare_generation(OnnxGenerator(decoders["source"]), OnnxGenerator(decoders["source"]), PROMPTS[:1], 3)
    record = generation_record(result, GenerationLimits(), [])
    stats = record["metrics"]["logits"]
    assert stats["token_agreement"] == {"min": 1.0, "avg": 1.0, "max": 1.0}
    assert 0.999999 < stats["step_cosine"]["min"] <= 1.0
    assert record["limits"] == {"logits": {"token_agreement_min": 1.0}}


def test_recipe_with_generation_but_no_generate_section_is_refused_at_load(decoders, tmp_path, monkeypatch):
    import shutil

    from edgebuild.build.jobs import load_variants
    from edgebuild.errors import RecipeError
    from edgebuild.registry import get_registry

    monkeypatch.chdir(tmp_path)
    copy_decoder(decoders["source"], tmp_path / "decoder.onnx")
    recipe = ("edgebuild: 1\nname: tiny\nsource: {model: decoder.onnx}\ntarget: {backend: testcopy}\n"
              "validate:\n  generation: {prompts: [[1, 2]], new_tokens: 4}\n")
    (tmp_path / "recipe.yaml").write_text(recipe)
    with pytest.raises(RecipeError, match=r"recipe.yaml:6:3 validate.generation: validation by generation needs a "
                                          r"generative recipe"):
        load_variants(["recipe.yaml"], None, get_registry())
    (tmp_path / "recipe.yaml").write_text(recipe + "variants:\n  fp16: {validate: {thresholds: {token_agreement_min: 2}}}\n")
    with pytest.raises(RecipeError, match=r"validate.thresholds.token_agreement_min"):
        load_variants(["recipe.yaml"], None, get_registry())


def test_a_source_format_without_a_generator_is_a_clear_error(tmp_path):
    from edgebuild.dag.validate import source_generator
    from edgebuild.protocols import Frontend

    class NoGenerator(Frontend):
        def import_model(self, path, inputs, out_dir, *, options=None, base_dir=None):
            return {}

    class Registry:
        def get(self, kind, name):
            return NoGenerator() if (kind, name) == ("frontends", "pytorch") else None

    variant = SimpleNamespace(recipe=SimpleNamespace(source=SimpleNamespace(format=None, model="model.pt2")),
                              base_dir=tmp_path, section=lambda name: None)
    with pytest.raises(BuildError, match="the pytorch frontend offers no generator"):
        source_generator(Registry(), variant, tmp_path / "model.pt2")

    class WithGenerator(NoGenerator):
        def generator(self, path, options, base_dir=None):
            return "eager generator"

    Registry.get = lambda self, kind, name: WithGenerator()
    assert source_generator(Registry(), variant, tmp_path / "model.pt2") == ("eager generator", "pytorch (eager)")


def test_onnx_sources_generate_with_onnxruntime_and_the_explicit_cache(decoders, tmp_path):
    """The stage's reference for an ONNX source (no frontend generator) is onnxruntime on the source."""
    from edgebuild.dag.validate import source_generator

    variant = SimpleNamespace(recipe=SimpleNamespace(source=SimpleNamespace(format=None, model="decoder.onnx")),
                              data={"generate": {"max_context": 64}}, base_dir=tmp_path, section=lambda name: None)
    generator, name = source_generator(None, variant, decoders["source"])
    assert name == "onnxruntime" and isinstance(generator, OnnxGenerator) and generator.path == decoders["source"]


def test_a_generative_recipe_is_validated_by_generation(decoders, tmp_path, monkeypatch):
    import shutil

    from edgebuild.build.jobs import load_variants
    from edgebuild.errors import RecipeError
    from edgebuild.recipe.model import Recipe
    from edgebuild.registry import get_registry

    if "generate" not in Recipe.model_fields:
        pytest.skip("this edgebuild has no generate: section")
    monkeypatch.chdir(tmp_path)
    copy_decoder(decoders["source"], tmp_path / "decoder.onnx")
    base = ("edgebuild: 1\nname: tiny\nsource: {model: decoder.onnx}\n"
            "target: {backend: coreml, deployment_target: iOS18}\ngenerate: {max_context: 64, query_lengths: [1, 8]}\n")
    (tmp_path / "recipe.yaml").write_text(base + "validate: {samples: 2}\n")
    with pytest.raises(RecipeError, match=r"recipe.yaml:6:1 validate: a generative recipe \(generate:\) is validated "
                                          r"by generation, and validate.generation is missing"):
        load_variants(["recipe.yaml"], None, get_registry())
    (tmp_path / "recipe.yaml").write_text(base + "validate: {generation: {prompts: [[1, 2]], new_tokens: 4}}\n")
    [variant] = load_variants(["recipe.yaml"], None, get_registry())
    assert variant.recipe.validate_.generation.new_tokens == 4
