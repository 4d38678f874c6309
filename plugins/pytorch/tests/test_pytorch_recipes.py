"""The example recipes build and validate end to end (both variants), the eager module as reference."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("edgebuild_coreml")

from pytorch_validation_bridge import copy_recipe, run_with_torch_reference  # noqa: E402

pytestmark = pytest.mark.slow
LIMITS = {"fp32": 0.9999, "fp16": 0.999}


@pytest.fixture
def cache_dir(tmp_path):
    """A fresh store whose source cache is the user's, so wheels are fetched once per machine."""
    from edgebuild.build import cache_root

    cache = tmp_path / "cache"
    cache.mkdir()
    shared = cache_root(None) / "sources"
    shared.mkdir(parents=True, exist_ok=True)
    (cache / "sources").symlink_to(shared, target_is_directory=True)
    return cache


@pytest.mark.parametrize("recipe", ["facenet_pnet.yaml", "facenet_rnet.yaml", "silero_vad_jit.yaml",
                                    "minilm_l6_torch.yaml"])
def test_example_recipe_builds_and_validates(recipe, tmp_path, cache_dir, monkeypatch):
    code, result = run_with_torch_reference(copy_recipe(recipe, tmp_path), monkeypatch, cache_dir)
    assert code == 0, [v.get("error") for v in result["variants"]]
    assert {v["variant"] for v in result["variants"]} == set(LIMITS)
    for variant in result["variants"]:
        assert variant["status"] == "built" and variant["validation"]["failures"] == []
        metrics = variant["validation"]["runtimes"]["interpreter"]["metrics"]
        for output, values in metrics.items():
            assert values["cosine"]["min"] >= LIMITS[variant["variant"]], (recipe, variant["variant"], output)
    assert (tmp_path / "build").is_dir()
