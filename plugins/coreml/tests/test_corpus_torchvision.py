"""torchvision's architectures build and validate at fp32 and fp16 (the corpus, edgebuild_testplugin.corpus).

Each entry is exported with ``torch.onnx.export`` as a user would, run by onnxruntime, and built
by ``edgebuild run --json`` on a recipe pinning its example shapes; the package must validate
against onnxruntime at the limits ``edgebuild init`` writes (cosine 0.9999 at fp32, 0.999 at fp16).
A model whose export fails, or that onnxruntime cannot run, is an expected failure naming why;
anything edgebuild does wrong fails the test.

A representative share (``Entry.ci``: a vision transformer and a convolutional segmentation net,
LR-ASPP on MobileNet V3) runs by default; every entry under ``-m slow``. ``benchmarks/corpus.py`` prints the same corpus as a table
beside coremltools. Exports are cached per process (EDGEBUILD_CORPUS_CACHE: across runs).
"""

from __future__ import annotations

import pytest
from edgebuild_testplugin import corpus
from edgebuild_testplugin.corpus_torchvision import ENTRIES

CASES = [pytest.param(entry, precision, id=f"{entry.name}-{precision}",
                      marks=() if entry.ci else pytest.mark.slow)
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


def test_ci_share_covers_attention_and_convolutional_segmentation():
    """The default share keeps a transformer and a convolutional dense-prediction net, and stays small."""
    families = {entry.name: entry.family for entry in ENTRIES if entry.ci}
    assert "segmentation" in families.values()
    assert any(name.startswith(("vit", "swin")) for name in families)
    assert len(families) <= 3
