"""The bundle backend's stages as the core assembles them: typed parameters holding what each body
reads (and nothing it does not), module-level bodies, the registry kinds and libraries they use,
and no validate stage of their own (the core validates with ``BundleBackend.candidates``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


def bundle_stages(tmp_path: Path, **changes):
    from edgebuild.build.jobs import load_variants
    from edgebuild.registry import get_registry

    recipe = yaml.safe_load((ROOT / "recipes" / "example_ops.yaml").read_text())
    recipe["source"]["model"] = str(ROOT / "recipes" / "models" / "example_ops.onnx")
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = recipe
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / f"recipe{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    registry = get_registry()
    (variant,) = load_variants([str(path)], None, registry)
    return {s.name: s for s in registry.get("backends", "bundle").stages(variant, registry)}


def test_stages_are_typed_with_module_level_bodies_and_no_validate(tmp_path):
    from edgebuild.plugin import StageParams

    stages = bundle_stages(tmp_path)
    assert list(stages) == ["partition", "lower", "package"]
    for stage in stages.values():
        assert isinstance(stage.params, StageParams)
        assert stage.body.__qualname__ == stage.body.__name__  # not a closure, lambda or method
        assert stage.body.__module__ == "edgebuild_mpsgraph.bundle_backend"
    assert stages["package"].extra["artifact"] == "bundle"
    assert set(stages["lower"].uses) == {"lowerings", "custom_ops", "backends"}
    assert "coremltools" in stages["lower"].libraries


@pytest.mark.parametrize("field, value, changed", [
    ("target__options__min_segment_ops", 6, {"partition"}),
    ("target__options__prefer", ["mpsgraph"], {"partition"}),
    ("target__precision", "float16", {"lower"}),
    ("compute__policy", "cpu_only", {"lower", "package"}),
    ("name", "renamed", {"package"}),
    ("validate__samples", 2, set()),  # the core's validate stage reads it, no bundle stage does
])
def test_a_recipe_field_changes_the_params_of_the_stages_that_read_it(tmp_path, field, value, changed):
    before = bundle_stages(tmp_path)
    after = bundle_stages(tmp_path, **{field: value})
    assert {n for n in before if before[n].key_params() != after[n].key_params()} == changed

