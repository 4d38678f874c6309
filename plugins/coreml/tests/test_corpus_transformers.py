"""transformers' architectures of the corpus build and validate at fp32 and fp16.

Each entry of :mod:`edgebuild_testplugin.corpus_transformers` is exported as a user would
(``torch.onnx.export``), run by onnxruntime, then built by ``edgebuild run`` with its inputs pinned
and validated (the interpreter against onnxruntime) at the thresholds ``edgebuild init`` writes:
cosine >= 0.9999 at fp32, >= 0.999 at fp16. An entry is xfail'ed only when its export or
onnxruntime fails (the corpus excludes it); every failure after that is edgebuild's.

The CI share (entries marked ``ci``: one cheap entry of every family, at fp32) runs by default,
beside the torchvision share; every entry at both precisions under ``-m slow``.
"""

from __future__ import annotations

import pytest
from edgebuild_testplugin import corpus
from edgebuild_testplugin.corpus_transformers import ENTRIES

PRECISIONS = ("fp32", "fp16")


def _cases():
    for entry in ENTRIES:
        for precision in PRECISIONS:
            marks = () if entry.ci and precision == "fp32" else (pytest.mark.slow,)
            yield pytest.param(entry, precision, id=f"{entry.family}-{entry.name}-{precision}", marks=marks)


def test_entries_named_once_and_a_share_in_ci():
    names = [entry.name for entry in ENTRIES]
    assert len(names) == len(set(names))
    chosen = [entry.family for entry in ENTRIES if entry.ci]
    assert sorted(chosen) == sorted({entry.family for entry in ENTRIES}), "one CI entry per family"


@pytest.mark.parametrize(("entry", "precision"), list(_cases()))
def test_transformers_entry_builds_and_validates(entry, precision, tmp_path):
    try:
        exported = corpus.export(entry)
        corpus.onnxruntime_runs(exported, entry)
    except corpus.Excluded as excluded:
        pytest.xfail(f"excluded from the corpus: {excluded}")
    built = corpus.build(exported, entry, tmp_path, precision)
    assert built.built, f"{entry.id} {precision}: {built.error}"
    limit = corpus.COSINE_MIN[corpus.PRECISIONS[precision]]
    assert built.validated and built.cosine is not None and built.cosine >= limit, (
        f"{entry.id} {precision}: worst cosine {built.cosine} (limit {limit}): {built.error}")
