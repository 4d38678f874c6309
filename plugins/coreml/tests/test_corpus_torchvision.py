"""torchvision's architectures build and validate at fp32 and fp16 (the corpus, edgebuild_testplugin.corpus).

Each entry is exported with ``torch.onnx.export`` as a user would, run by onnxruntime, and built
by ``edgebuild run --json`` on a recipe pinning its example shapes; the package must validate
against onnxruntime at the limits ``edgebuild init`` writes (cosine 0.9999 at fp32, 0.999 at fp16).
A model whose export fails, or that onnxruntime cannot run, is an expected failure naming why;
anything edgebuild does wrong fails the test.

A representative share runs by default: one cheap entry of every family (``Entry.ci``) at fp32,
and a vision transformer and a convolutional segmentation net (LR-ASPP on MobileNet V3) at fp16
too; every entry at both precisions under ``-m slow``. ``benchmarks/corpus.py`` prints the same corpus as a table
beside coremltools. Exports are cached per process (EDGEBUILD_CORPUS_CACHE: across runs).
"""

from __future__ import annotations

import pytest
from edgebuild_testplugin import corpus
from edgebuild_testplugin.corpus_torchvision import ENTRIES

# the fp16 share: attention and a convolutional dense-prediction net (the fp16 guard's two kinds)
FP16_IN_CI = {"vit_small", "lraspp_mobilenet_v3_large"}


def in_ci(entry, precision: str) -> bool:
    return entry.ci and (precision == "fp32" or entry.name in FP16_IN_CI)


CASES = [pytest.param(entry, precision, id=f"{entry.name}-{precision}",
                      marks=() if in_ci(entry, precision) else pytest.mark.slow)
         for entry in ENTRIES for precision in ("fp32", "fp16")]


def entered(entry) -> corpus.Exported:
    """The entry's ONNX file, or an expected failure when the export or onnxruntime fails."""
    import numpy as np

    try:
        exported = corpus.export(entry)
        outputs = corpus.onnxruntime_runs(exported, entry)
    except corpus.Excluded as excluded:
        pytest.xfail(f"{entry.id} left out of the corpus: {excluded}")
    # a constant output (a head initialised to zero) would match anything at cosine 1
    varying = [out for out in map(np.asarray, outputs) if out.dtype.kind == "f" and out.size and np.ptp(out) > 0]
    assert varying, f"{entry.id}: every float output is constant or empty on the example"
    return exported


@pytest.mark.parametrize("entry, precision", CASES)
def test_torchvision_architecture_builds_and_validates(entry, precision, tmp_path):
    exported = entered(entry)
    built = corpus.build(exported, entry, tmp_path, precision)
    limit = corpus.COSINE_MIN[corpus.PRECISIONS[precision]]
    assert built.built, f"{entry.id} {precision}: {built.error}"
    assert built.validated and built.cosine is not None and built.cosine >= limit, (
        f"{entry.id} {precision}: cosine {built.cosine} (limit {limit}): {built.error}")


def test_ci_share_covers_every_family_and_stays_small():
    """The default share keeps one entry of every family, a transformer and a convolutional
    dense-prediction net at fp16, and stays small."""
    chosen = [entry for entry in ENTRIES if entry.ci]
    assert {entry.family for entry in chosen} == {entry.family for entry in ENTRIES}
    assert max(sum(entry.family == family for entry in chosen) for family in {e.family for e in chosen}) == 1
    assert FP16_IN_CI <= {entry.name for entry in chosen}
    assert any(name.startswith(("vit", "swin")) for name in FP16_IN_CI)
    assert "segmentation" in {entry.family for entry in chosen if entry.name in FP16_IN_CI}


def test_a_build_past_its_time_limit_is_a_failed_row(monkeypatch, tmp_path):
    """A build that outlasts ``BUILD_TIMEOUT`` is recorded as not built, naming the limit, and the
    corpus run goes on to the next entry instead of stopping."""
    import subprocess

    def times_out(*args, cwd, timeout=corpus.BUILD_TIMEOUT):
        raise subprocess.TimeoutExpired(cmd=["edgebuild", *map(str, args)], timeout=timeout)

    monkeypatch.setattr(corpus, "_edgebuild", times_out)
    entry = next(entry for entry in ENTRIES if entry.name == "resnet18")
    exported = corpus.Exported(tmp_path / "model.onnx", "dynamo", ("x",), {"x": [1, 3, 64, 64]}, {"x": "float32"}, 0.0)
    monkeypatch.setattr(corpus, "recipe", lambda exported, entry, precision: {"source": {}})
    built = corpus.build(exported, entry, tmp_path, "fp16")
    assert (built.built, built.validated, built.cosine) == (False, False, None)
    assert built.error == f"timed out after {corpus.BUILD_TIMEOUT} s"
