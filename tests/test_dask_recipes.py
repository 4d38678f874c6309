"""Real recipes on a real Dask cluster: recipes/example_ops.yaml (a Core ML -> Metal -> Core ML
bundle) and recipes/ppocr_cls.yaml (two variants sharing import and optimize) build the same
stages and the same artifacts as the local executor.

"The same" up to what no two Core ML builds share, local or not: coremltools names the items of
an ``.mlpackage``'s Manifest.json with fresh uuid4s and writes the model's protobuf maps in hash
order. So artifacts are compared with those two normalised, and stage keys are compared along
each variant's chain up to the first stage whose output differs only by them (the keys after it
take that output's digest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("distributed")
pytest.importorskip("edgebuild_coreml")
pytest.importorskip("edgebuild_example_ops")
pytest.importorskip("edgebuild_mpsgraph")

from dask_cluster import cluster, edgebuild, summary, tree_digest  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]


def recipes_in(folder: Path) -> list[Path]:
    """The two recipes, copied with their outputs under ``folder``."""
    (folder / "models").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "models" / "example_ops.onnx", folder / "models")
    paths = []
    for name in ("example_ops", "ppocr_cls"):
        recipe = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
        recipe["outputs"] = {"dir": "out"}
        paths.append(folder / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(recipe))
    return paths


def without_random_identifiers(file: Path) -> bytes:
    """A Core ML package's file with its uuid4 item names and hash-ordered maps made canonical."""
    if file.name == "Manifest.json" and file.parent.suffix == ".mlpackage":
        manifest = json.loads(file.read_text())
        items = manifest.get("itemInfoEntries", {})
        manifest["rootModelIdentifier"] = items.get(manifest.get("rootModelIdentifier"), {}).get("path")
        manifest["itemInfoEntries"] = sorted(items.values(), key=lambda item: item.get("path", ""))
        return json.dumps(manifest, sort_keys=True).encode()
    if file.suffix == ".mlmodel":
        from coremltools.proto import Model_pb2

        model = Model_pb2.Model()
        model.ParseFromString(file.read_bytes())
        return model.SerializeToString(deterministic=True)
    return file.read_bytes()


def compare_chain(label: str, local: dict, distributed: dict, local_store, cluster_store) -> str | None:
    """Assert the stage keys agree along the chain; return the first stage whose outputs differ
    only by Core ML's random identifiers (None if every output is byte-identical)."""
    from edgebuild.store.local import Store

    for (name, want), (got_name, got) in zip(local["keys"], distributed["keys"]):
        assert (got_name, got) == (name, want), f"{label}: stage {name}"
        if name == "resolve":
            continue
        mine, theirs = Store(local_store).lookup(want), Store(cluster_store).lookup(got)
        if mine.digest != theirs.digest:
            assert tree_digest(mine.out, without_random_identifiers) == \
                tree_digest(theirs.out, without_random_identifiers), f"{label}: stage {name}'s output"
            return name
    return None


@pytest.mark.slow
def test_real_recipes_build_alike_on_the_cluster_and_locally(cluster, tmp_path):  # noqa: F811
    recipes = recipes_in(tmp_path / "recipes")
    local = edgebuild("run", *recipes, "-j", "1", "--json", cwd=tmp_path, cache=tmp_path / "local-store")
    local_builds = summary(local, without_random_identifiers)  # now: the next run replaces the outputs
    on_cluster = edgebuild("run", *recipes, "--executor", cluster.executor, "--json", cwd=tmp_path,
                           cache=tmp_path / "cluster-store")
    cluster_builds = summary(on_cluster, without_random_identifiers)

    assert sorted(local_builds) == sorted(cluster_builds) == ["example_ops:default", "ppocr_cls:fp16", "ppocr_cls:fp32"]
    first_core_ml = {label: compare_chain(label, want, cluster_builds[label], tmp_path / "local-store",
                                          tmp_path / "cluster-store") for label, want in local_builds.items()}
    # everything before Core ML's packaging agrees byte for byte (import, optimize, partition...)
    assert set(first_core_ml.values()) <= {"lower", None}, first_core_ml
    for label, want in local_builds.items():
        assert cluster_builds[label]["artifacts"] == want["artifacts"] != [], label
    # the variants' shared stages ran once on the cluster too
    assert cluster_builds["ppocr_cls:fp32"]["statuses"][:3] == ["cached", "cached", "cached"]
