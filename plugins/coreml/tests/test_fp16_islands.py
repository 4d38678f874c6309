"""The fp16 guard's islands reach the saved program, whatever the passes after the cast do to them.

The guard names ops to keep in fp32 where the cast pass sees the program; the passes after it may
recreate an op under another name (``topological_reorder`` moves every transpose and cast that
way), fuse it into its reader (``fuse_activation_silu``), replace it (``fuse_pow2_sqrt``) or
rename it (the backend's name sanitizer). The lower stage checks the islands by value, so each of
those builds; an island the saved program computes in fp16 still fails it. Real front ends: an
STFT-as-convolution log-mel fed int16-scale audio (CI), Wav2Vec2's and HuBERT's conv feature
encoders on raw int16-scale audio (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from recipe_runs import run_built
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from edgebuild.plugin import BuildError
from edgebuild_coreml import fp16_guard
from edgebuild_coreml.interpreter import run_program
from edgebuild_coreml.lower import check_kept_fp32
from edgebuild_coreml.lowering.converter import ConvertResult
from edgebuild_coreml.lowering.package import save_mlpackage

SHAPE = (2, 4)
SAMPLE = {"x": np.linspace(100.0, 400.0, 8, dtype=np.float32).reshape(SHAPE)}  # squares reach 160000


# -- one program with a branch per kind of pass that removes or renames an island's op --------------

def every_pass_kind():
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)])
    def prog(x):
        # recreated: topological_reorder rebuilds every transpose (and cast) under a new op name,
        # keeping its output's name
        square = mb.mul(x=x, y=x, name="square")
        flipped = mb.transpose(x=square, perm=[1, 0], name="flip")
        recreated = mb.mul(x=flipped, y=np.float32(1e-3), name="recreated")
        # fused: fuse_activation_silu folds sigmoid(y) * y into one silu; the sigmoid's value is gone
        big = mb.mul(x=x, y=np.float32(300.0), name="big")
        gated = mb.mul(x=big, y=mb.sigmoid(x=big, name="gate"), name="gated")
        fused = mb.mul(x=gated, y=np.float32(1e-3), name="fused")
        # replaced: fuse_pow2_sqrt turns sqrt(pow(y, 2)) into an identity of y under the sqrt's name
        tripled = mb.mul(x=x, y=np.float32(3.0), name="tripled")
        root = mb.sqrt(x=mb.pow(x=tripled, y=np.float32(2.0), name="pow2"), name="root")
        replaced = mb.mul(x=root, y=np.float32(1e-3), name="replaced")
        # renamed: the backend's sanitize_name_strings renames what is not an identifier
        odd = mb.mul(x=x, y=x, name="enc/square.0")
        renamed = mb.mul(x=odd, y=np.float32(1e-3), name="renamed")
        return recreated, fused, replaced, renamed
    return prog


# output -> (ops of its branch the guard keeps, ops whose values a pass removes)
BRANCHES = {
    "recreated": ({"square", "flip"}, set()),
    "fused": ({"big", "gated"}, {"gate"}),
    "replaced": ({"root"}, {"pow2"}),
    "renamed": ({"enc/square.0"}, set()),
}


def guarded_save(tmp_path: Path, *, honour: bool = True):
    """every_pass_kind() saved at fp16 with the guard measuring SAMPLE; ``honour=False`` measures but
    keeps nothing in fp32 (what the saved program would be if the islands were lost)."""
    record = {}

    def before_cast(program):
        record["guard"] = guard = fp16_guard.find_overflows(program, [SAMPLE])
        return guard.keep_fp32 if honour else set()

    result = ConvertResult(program=every_pass_kind(), input_names={"x": "x"},
                           output_names={name: name for name in BRANCHES}, input_shapes={"x": SHAPE})
    model = save_mlpackage(result, tmp_path / "m.mlpackage", target="iOS17", precision="float16", metadata={},
                           before_fp16_cast=before_cast, consume=True)
    return model._mil_program, record["guard"]


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_islands_later_passes_rewrite_still_build_and_compute_in_fp32(tmp_path):
    saved, guard = guarded_save(tmp_path)
    checked = check_kept_fp32(saved, guard, "m.mlpackage")
    dtypes = {v.name: v.dtype for op in saved.functions["main"].operations for v in op.outputs}
    assert not checked.in_fp16
    for output, (kept, removed) in BRANCHES.items():
        assert kept <= guard.keep_fp32 and kept <= set(checked.kept), output
        assert removed <= set(checked.folded), output
        assert all(dtypes[v] == types.fp32 for op in kept for v in checked.kept[op]), output
    assert "transpose" not in {op.op_type for op in saved.functions["main"].operations if op.name == "flip"}
    assert checked.kept["enc/square.0"] == ["enc_square_0"]
    expected, got = run_program(every_pass_kind(), SAMPLE), run_program(saved, SAMPLE)
    for output in BRANCHES:
        assert np.isfinite(got[output]).all() and cosine(got[output], expected[output]) > 0.9999, output


def test_the_check_fails_where_the_saved_program_lost_the_islands(tmp_path):
    """The same program with the islands cast to fp16 overflows, and the check names each island."""
    saved, guard = guarded_save(tmp_path, honour=False)
    outputs = run_program(saved, SAMPLE)
    assert not np.isfinite(outputs["recreated"]).all() and not np.isfinite(outputs["renamed"]).all()
    with pytest.raises(BuildError, match=r"the fp16 guard asked to keep .* in fp32, but the saved program "
                                         r"computes them in fp16") as caught:
        check_kept_fp32(saved, guard, "m.mlpackage")
    for kept, _ in BRANCHES.values():
        assert any(f"{name} (as " in caught.value.message for name in kept), kept


def test_the_cast_pass_checks_its_own_islands_by_name():
    """Right after the cast, names are exact: an op it was asked to keep, cast to fp16 or gone, fails."""
    from edgebuild_coreml.lowering.passes import _check_islands_cast_fp32

    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE, dtype=types.fp16)])
    def cast(x):
        return mb.mul(x=x, y=x, name="square")

    _check_islands_cast_fp32(every_pass_kind(), {"square", "flip"})
    with pytest.raises(BuildError, match=r"asked to keep gone, square in fp32, but cast them to fp16"):
        _check_islands_cast_fp32(cast, {"square", "gone"})


# -- real front ends ---------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]
N_FFT, HOP, N_MELS, RATE = 400, 160, 40, 16000


def _mel_filters() -> np.ndarray:
    """Triangular filters on the mel scale (HTK formula), as Whisper's and librosa's feature extractors."""
    mel = np.linspace(0.0, 2595.0 * np.log10(1.0 + RATE / 2 / 700.0), N_MELS + 2)
    hz = 700.0 * (10 ** (mel / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(N_FFT, 1.0 / RATE)
    low, centre, high = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    return np.maximum(0, np.minimum((bins - low) / (centre - low), (high - bins) / (high - centre))).astype(np.float32)


def _log_mel_module():
    """An STFT written as a strided Conv1d over DFT basis rows (Hann window), power, mel matmul, log10."""
    import torch

    class LogMel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            n, k = np.arange(N_FFT), np.arange(N_FFT // 2 + 1)[:, None]
            window = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)
            basis = np.concatenate([np.cos(2 * np.pi * k * n / N_FFT), -np.sin(2 * np.pi * k * n / N_FFT)]) * window
            self.stft = torch.nn.Conv1d(1, basis.shape[0], N_FFT, stride=HOP, bias=False)
            self.stft.weight.data = torch.from_numpy(basis[:, None, :].astype(np.float32))
            self.register_buffer("mel", torch.from_numpy(_mel_filters()))

        def forward(self, audio):
            frames = torch.nn.functional.pad(audio[:, None, :], (N_FFT // 2, N_FFT // 2), mode="reflect")
            real, imag = self.stft(frames).chunk(2, dim=1)
            power = real * real + imag * imag  # int16-scale audio: ~1e12, far past fp16's 65504
            mel = torch.matmul(power.transpose(1, 2), self.mel.t()).transpose(1, 2)
            return torch.log10(torch.clamp(mel, min=1e-10))

    return LogMel().eval()


def _export(module, path: Path, samples: int) -> Path:
    import torch

    torch.onnx.export(module, (torch.zeros(1, samples),), str(path), input_names=["audio"], output_names=["features"],
                      dynamo=False, opset_version=17)
    return path


def _build_fp16(model: Path, samples: int, workdir: Path) -> dict:
    recipe = workdir / "front_end.yaml"
    recipe.write_text(
        "edgebuild: 1\nname: front_end\n"
        f"source: {{model: {json.dumps(str(model))}, inputs: {{audio: {{shape: [1, {samples}], dtype: float32}}}}}}\n"
        "target: {backend: coreml, deployment_target: iOS17, precision: float16}\n"
        "validate:\n  samples: 2\n"
        "  inputs: {audio: {random: {low: -32768.0, high: 32767.0, seed: 0}}}\n"
        "  thresholds: {cosine_min: 0.999}\n"
        "outputs: {dir: out}\n"
    )
    record, report = run_built(recipe, workdir)
    return {"record": record, "guard": report["lower"]["fp16_guard"], "islands": report["lower"]["fp16_islands"]}


def _min_cosine(record: dict) -> float:
    metrics = record["validation"]["runtimes"]["interpreter"]["metrics"]
    return min(m["cosine"]["min"] for m in metrics.values())


def test_log_mel_front_end_on_int16_scale_audio_builds_at_fp16_with_its_islands(tmp_path):
    built = _build_fp16(_export(_log_mel_module(), tmp_path / "log_mel.onnx", 8000), 8000, tmp_path)
    guard = built["guard"]
    overflowing = {entry["op"] for entry in guard["kept_fp32"]}
    assert any("Conv" in name for name in overflowing) and any("Transpose" in name for name in overflowing)
    assert set(built["islands"]["fp32"]) >= {name for name in overflowing if "Transpose" in name}
    assert _min_cosine(built["record"]) >= 0.999


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wav2vec2", "hubert"])
def test_speech_encoders_on_raw_int16_scale_audio_build_at_fp16(family, tmp_path):
    """The conv feature encoder's first conv and its norm (group norm for Wav2Vec2, a layer norm
    between two transposes for HuBERT) leave fp16's range; the islands reach the saved program."""
    import torch
    import transformers

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    torch.manual_seed(0)
    if family == "wav2vec2":
        encoder = transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(feat_extract_norm="group", **common))
    else:
        encoder = transformers.HubertModel(transformers.HubertConfig(feat_extract_norm="layer", **common))

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, audio):
            return self.encoder(audio).last_hidden_state

    built = _build_fp16(_export(LastHidden().eval(), tmp_path / f"{family}.onnx", 4000), 4000, tmp_path)
    assert built["guard"]["kept_fp32"] and built["islands"]["fp32"]
    assert _min_cosine(built["record"]) >= 0.999
