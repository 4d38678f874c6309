"""Decoder LLMs end to end: five tiny families (edgebuild_testplugin.llm_families: Llama, Qwen2,
Phi-3, Gemma-2, GPT-2), each from both sources — the ONNX decoder the PyTorch plugin exports
(optimum layout) and the checkpoint itself (config.json + model.safetensors, ``kind:
causal_lm``) — built by ``edgebuild run --json`` from a generative recipe into stateful
packages (fp32, fp16, 4-bit per-block weights) and validated by generation against the
source (onnxruntime with the explicit cache, or eager PyTorch). Also onnxruntime-genai's
GroupQueryAttention layout (fp32 and its int4 MatMulNBits graphs) for Llama, Qwen2 and Phi-3.

The fp32 variant must agree on every token. The fp16 and int4 floors below are what these
builds measured, the lowest over the five families and both sources, rounded down. These are
random-weight models: their logits are nearly flat, so 4-bit weights flip greedy choices
early (agreement per prompt down to 0, first divergence at step 0 or 1) while the logits stay
close (step cosine >= 0.91). Each run's JSON carries, per variant and prompt, the agreement
rate and the first divergence.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("coremltools")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from edgebuild_testplugin import llm_families  # noqa: E402
from edgebuild_testplugin.cli_runner import edgebuild  # noqa: E402

MAX_CONTEXT = 128
NEW_TOKENS = 12
# The first prompt is longer than 16 (a chunk of 16, then ones) and than Gemma-2's window (8).
PROMPTS = [[1, 17, 93, 5, 42, 250, 7, 11, 64, 3, 99, 120, 33, 8, 71, 19, 201, 4, 55], [1, 200]]
TEXTS = ["t17 t93 t5 t42 t250 t7 t11 t64 t3 t99 t120 t33 t8 t71 t19 t201 t4 t55", "t200 t9"]

# (token_agreement_min, step_cosine_min), held per prompt. Measured (worst over families and sources):
# fp32 agreement 1.0, cosine 0.99999990; fp16 agreement 1.0, cosine 0.9999967 (Gemma-2);
# int4 agreement 0.0 on some prompt (Phi-3, Gemma-2), cosine 0.913 (Gemma-2).
FP32 = (1.0, 0.9999)
FP16 = (1.0, 0.9999)
INT4 = (0.0, 0.9)
# onnxruntime-genai's int4 graphs built as they are (fp32 variant): onnxruntime's MatMulNBits
# (accuracy level 4 on CPU) rounds the activations to int8, the artifact does not, so near-tied
# greedy choices can differ (Phi-3: a prompt diverges at step 1); cosine >= 0.99993 measured.
GENAI_INT4 = (0.0, 0.9999)
COMPRESSION = "{weights: {mode: linear, dtype: int4, granularity: per_block, block_size: 32}}"
# Mixed precision under a size budget between all-int4 (0.148 MB for tiny Llama) and all-int8.
AUTO_BUDGET_MB = 0.2
AUTO = (f"{{auto: {{max_size_mb: {AUTO_BUDGET_MB}, sensitivity: activations, samples: 2, candidates: ["
        "{mode: linear, dtype: int4, granularity: per_block, block_size: 32}, "
        "{mode: linear, dtype: int8, granularity: per_channel}, {mode: none}]}}")

RECIPE = """\
edgebuild: 1
name: tiny-{family}
source:
  model: {model}
{options}target: {{backend: coreml, deployment_target: iOS18, precision: float32}}
compute: {{policy: cpu_only}}
generate:
  max_context: {max_context}
  query_lengths: [1, 16]
validate:
  generation:
    prompts: {prompts}
    new_tokens: {new_tokens}
  thresholds: {{token_agreement_min: {fp32[0]}, step_cosine_min: {fp32[1]}}}
variants:
  fp32: {{}}
  fp16:
    target: {{precision: float16}}
    validate: {{thresholds: {{token_agreement_min: {fp16[0]}, step_cosine_min: {fp16[1]}}}}}
  int4:
    target: {{precision: float16}}
    compression: {compression}
    validate: {{thresholds: {{token_agreement_min: {int4[0]}, step_cosine_min: {int4[1]}}}}}
  auto:
    target: {{precision: float16}}
    compression: {auto}
    validate: {{thresholds: {{token_agreement_min: {int4[0]}, step_cosine_min: {int4[1]}}}}}
outputs: {{dir: out}}
"""

# The default run: one case per family, the sources alternating so both routes are built, one
# of them with every variant. Everything else is slow.
DEFAULT_CASES = {("llama", "onnx"): ("fp32", "fp16", "int4"), ("qwen2", "pytorch"): ("fp32",),
                 ("phi3", "onnx"): ("fp32",), ("gemma2", "pytorch"): ("fp32",), ("gpt2", "onnx"): ("fp32",)}
SLOW_CASES = {(f, s) for f in llm_families.FAMILIES for s in ("onnx", "pytorch")} - set(DEFAULT_CASES)


def _source(family: str, source: str, directory):
    """(source.model, source.options lines) with the source copied beside the recipe."""
    if source == "onnx":
        decoder = llm_families.onnx_decoder(family)
        for path in decoder.parent.iterdir():
            shutil.copy(path, directory / path.name)
        return decoder.name, ""
    checkpoint = directory / "checkpoint"
    shutil.copytree(llm_families.checkpoint(family), checkpoint)
    return "checkpoint/model.safetensors", "  options: {kind: causal_lm}\n"


def build(directory, family: str, model: str, options: str = "", *, variants=("fp32", "fp16", "int4"),
          prompts=None, fp32=FP32) -> dict:
    """``edgebuild run --json`` of the generative recipe in ``directory``; the parsed JSON."""
    recipe = RECIPE.format(family=family, model=model, options=options, max_context=MAX_CONTEXT,
                           prompts=json.dumps(prompts or PROMPTS), new_tokens=NEW_TOKENS, fp32=fp32, fp16=FP16,
                           int4=INT4, compression=COMPRESSION, auto=AUTO)
    (directory / "recipe.yaml").write_text(recipe)
    selected = [arg for name in variants for arg in ("--variant", name)]
    done = edgebuild("run", "recipe.yaml", "--json", *selected, cwd=directory,
                     env={"EDGEBUILD_CACHE_DIR": str(directory / "cache")})
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return json.loads(done.stdout)


def generation(result: dict, variant: str) -> dict:
    """The interpreter's generation record of ``variant`` in the run's JSON."""
    [entry] = [v for v in result["variants"] if v["variant"] == variant]
    assert entry["status"] == "built", entry.get("error") or entry["validation"].get("failures")
    return entry["validation"]["runtimes"]["interpreter"]["generation"]


def summary(result: dict, variant: str) -> tuple[float, float, list]:
    """(mean token agreement, worst step cosine, first divergence per prompt) of one variant."""
    record = generation(result, variant)
    return (record["mean_agreement"], record["worst_step_cosine"],
            [p["first_divergence"] for p in record["prompts"]])


def _case(family, source):
    marks = [pytest.mark.slow] if (family, source) in SLOW_CASES else []
    return pytest.param(family, source, marks=marks, id=f"{family}-{source}")


CASES = [_case(f, s) for f in llm_families.FAMILIES for s in ("onnx", "pytorch")]


@pytest.mark.parametrize("family, source", CASES)
def test_family_builds_and_generates_as_its_source(family, source, tmp_path):
    model, options = _source(family, source, tmp_path)
    variants = DEFAULT_CASES.get((family, source), ("fp32", "fp16", "int4"))
    result = build(tmp_path, family, model, options, variants=variants)
    agreement, cosine, divergence = summary(result, "fp32")
    assert agreement == 1.0 and divergence == [None, None] and cosine >= FP32[1]
    record = generation(result, "fp32")
    assert [len(p["artifact_tokens"]) for p in record["prompts"]] == [NEW_TOKENS] * len(PROMPTS)
    for variant, (agreement_min, cosine_min) in (("fp16", FP16), ("int4", INT4)):
        if variant in variants:
            agreement, cosine, _ = summary(result, variant)
            assert agreement >= agreement_min and cosine >= cosine_min, (variant, agreement, cosine)


@pytest.mark.slow
def test_auto_compression_calibrates_on_the_prompts_under_a_size_budget(tmp_path):
    """``compression: auto`` of a generative recipe: each layer's sensitivity measured by running the
    stateful artifact on the validation prompts (recorded as the calibration source), a mix of
    per-layer modes chosen, the package within the budget, and generation validated after."""
    model, options = _source("llama", "onnx", tmp_path)
    result = build(tmp_path, "llama", model, options, variants=("auto",))
    [entry] = result["variants"]
    report = json.loads(Path(entry["report_json"]).read_text())["compress"]["auto"]
    assert report["calibration"] == {"source": "validate.generation.prompts", "samples": len(PROMPTS)}
    assert report["sensitivity_method"] == "activations"
    assert report["met"] and report["size_mb"] <= AUTO_BUDGET_MB
    assert sum(entry["artifact_sizes"].values()) <= AUTO_BUDGET_MB * 1e6
    chosen = {layer["mode"] for layer in report["chosen"]}
    assert len(report["chosen"]) >= 14 and len(chosen) >= 2, chosen  # a real mix, layer by layer
    _, cosine, _ = summary(result, "auto")
    assert cosine >= INT4[1]


@pytest.mark.slow
def test_prompts_from_the_shipped_tokenizer(tmp_path):
    """validate.generation.prompts as texts through the checkpoint's own tokenizer.json."""
    model, options = _source("llama", "pytorch", tmp_path)
    shutil.copy(tmp_path / "checkpoint" / "tokenizer.json", tmp_path / "tokenizer.json")
    prompts = {"tokenizer": "tokenizer.json", "texts": TEXTS}
    result = build(tmp_path, "llama", model, options, variants=("fp32",), prompts=prompts)
    record = generation(result, "fp32")
    assert [p["text"] for p in record["prompts"]] == TEXTS
    assert record["prompts"][0]["prompt"] == PROMPTS[0][1:]  # the word-level vocabulary: t<id> is id
    assert record["mean_agreement"] == 1.0 and record["worst_step_cosine"] >= FP32[1]


GENAI_CASES = [pytest.param(f, p, marks=pytest.mark.slow, id=f"{f}-genai-{p}")
               for f in llm_families.GENAI_FAMILIES for p in ("fp32", "int4")]


@pytest.mark.parametrize("family, precision", GENAI_CASES)
def test_onnxruntime_genai_decoder_builds_and_generates(family, precision, tmp_path):
    """onnxruntime-genai's layout: GroupQueryAttention (rotary inside, packed QKV) takes its
    seqlens_k / total_sequence_length from the attention mask the stateful wrapper derives, and
    leaves the cache's head size symbolic (read from the attention's query width). Its int4
    graph's MatMulNBits weights are built as they are (the fp32 variant)."""
    pytest.importorskip("onnxruntime_genai")
    decoder = llm_families.genai_decoder(family, precision)
    for path in decoder.parent.iterdir():
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    limits = FP32 if precision == "fp32" else GENAI_INT4
    result = build(tmp_path, family, decoder.name, variants=("fp32",), fp32=limits)
    agreement, cosine, divergence = summary(result, "fp32")
    assert cosine >= limits[1]
    if precision == "fp32":
        assert agreement == 1.0 and divergence == [None, None]


def test_the_plan_has_a_row_per_query_length():
    """A generative recipe's enumerated query lengths are the plan's shape choices (input_ids
    is the stateful artifact's only flexible input); a range plans the flexible program only."""
    from edgebuild_coreml.compute import shape_choices

    assert shape_choices({}, {}, {"max_context": 128, "query_lengths": [16, 1]}) == [
        {"input_ids": (1, 1)}, {"input_ids": (1, 16)}]
    assert shape_choices({}, {}, {"max_context": 128, "query_lengths": {"range": [1, 64]}}) == []
    assert shape_choices({}, {}, None) == []


# The optimise stage's counts on each family's exported decoder (batch, query and cache lengths
# dynamic): rotary fuses per rotated tensor (q and k of both layers), a tied head once.
DECODER_FUSIONS = {
    "llama": {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
              "fuse_gated_mlp": 2, "share_tied_embeddings": 0},
    "qwen2": {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
              "fuse_gated_mlp": 2, "share_tied_embeddings": 0},
    "phi3": {"fuse_rms_norm": 5, "fuse_rotary": 4, "fuse_attention": 2, "fuse_grouped_query_attention": 2,
             "fuse_gated_mlp": 2, "share_tied_embeddings": 0},
    "gemma2": {"fuse_rms_norm": 9, "fuse_rotary": 4, "fuse_attention": 0, "fuse_grouped_query_attention": 4,
               "fuse_gated_mlp": 0, "share_tied_embeddings": 1},
    "gpt2": {"fuse_rms_norm": 0, "fuse_rotary": 0, "fuse_attention": 2, "fuse_grouped_query_attention": 0,
             "fuse_gated_mlp": 0, "share_tied_embeddings": 1},
}


@pytest.mark.parametrize("family", [pytest.param(f, marks=[pytest.mark.slow] if (f, "onnx") in SLOW_CASES else [])
                                    for f in llm_families.FAMILIES])
def test_fusion_counts_on_the_exported_decoder(family, tmp_path):
    from edgebuild.graph.optimize import optimize

    report = optimize(llm_families.onnx_decoder(family), tmp_path / "optimized")
    assert {name: report["rules"].get(name) for name in DECODER_FUSIONS[family]} == DECODER_FUSIONS[family]


TIED_CASES = [pytest.param(f, s, marks=[] if (f, s) == ("gpt2", "onnx") else [pytest.mark.slow], id=f"{f}-{s}")
              for f in ("gpt2", "gemma2") for s in ("onnx", "pytorch")]


@pytest.mark.parametrize("family, source", TIED_CASES)
def test_tied_embedding_table_is_stored_once(family, source, tmp_path):
    """GPT-2 and Gemma-2 read one table at both ends: the fp16 package's weight file holds the
    model's distinct parameters once (the table not twice), and generation still matches."""
    model, options = _source(family, source, tmp_path)
    result = build(tmp_path, family, model, options, variants=("fp16",))
    agreement, cosine, _ = summary(result, "fp16")
    assert agreement >= FP16[0] and cosine >= FP16[1]
    weights = sum(path.stat().st_size for path in (tmp_path / "out" / "fp16").rglob("weight.bin"))
    lm = llm_families.model(family)
    distinct = sum(p.numel() for p in lm.parameters()) * 2  # parameters() yields a tied table once
    table = lm.get_input_embeddings().weight.numel() * 2
    assert weights < distinct + table / 2, (weights, distinct, table)
