"""The example recipes build and validate end to end (both variants), the eager module as reference."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("edgebuild_coreml")

from pytorch_recipe_runner import copy_recipe, run_recipe  # noqa: E402

LIMITS = {"fp32": 0.9999, "fp16": 0.999}


@pytest.fixture
def cache_dir(tmp_path):
    """A fresh store whose source cache is the user's, so wheels are fetched once per machine."""
    from edgebuild.store.location import cache_root

    cache = tmp_path / "cache"
    cache.mkdir()
    shared = cache_root(None) / "sources"
    shared.mkdir(parents=True, exist_ok=True)
    (cache / "sources").symlink_to(shared, target_is_directory=True)
    return cache


SLOW = pytest.mark.slow


@pytest.mark.parametrize("recipe", ["facenet_pnet.yaml", pytest.param("facenet_rnet.yaml", marks=SLOW),
                                    pytest.param("silero_vad_jit.yaml", marks=SLOW),
                                    pytest.param("minilm_l6_torch.yaml", marks=SLOW)])
def test_example_recipe_builds_and_validates(recipe, tmp_path, cache_dir):
    code, result = run_recipe(copy_recipe(recipe, tmp_path), cache_dir)
    assert code == 0, [v.get("error") for v in result["variants"]]
    assert {v["variant"] for v in result["variants"]} == set(LIMITS)
    for variant in result["variants"]:
        assert variant["status"] == "built" and variant["validation"]["failures"] == []
        assert variant["validation"]["reference"] == "pytorch (eager)"  # the module itself, not its export
        metrics = variant["validation"]["runtimes"]["interpreter"]["metrics"]
        for output, values in metrics.items():
            assert values["cosine"]["min"] >= LIMITS[variant["variant"]], (recipe, variant["variant"], output)
    assert (tmp_path / "build").is_dir()
