"""Real recipes on a real Dask cluster: recipes/example_ops.yaml (a Core ML -> Metal -> Core ML
bundle) and recipes/ppocr_cls.yaml (two variants sharing import and optimize) build the same
stage keys and the same artifacts, byte for byte, as the local executor."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("distributed")
pytest.importorskip("edgebuild_coreml")
pytest.importorskip("edgebuild_example_ops")
pytest.importorskip("edgebuild_mpsgraph")

from dask_cluster import cluster, edgebuild, same_builds, summary  # noqa: E402,F401

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


@pytest.mark.slow
def test_real_recipes_build_alike_on_the_cluster_and_locally(cluster, tmp_path):  # noqa: F811
    recipes = recipes_in(tmp_path / "recipes")
    local = edgebuild("run", *recipes, "-j", "1", "--json", cwd=tmp_path, cache=tmp_path / "local-store")
    local_builds = summary(local)  # read now: the cluster's run replaces the output folders
    on_cluster = edgebuild("run", *recipes, "--executor", cluster.executor, "--json", cwd=tmp_path,
                           cache=tmp_path / "cluster-store")
    cluster_builds = summary(on_cluster)

    assert sorted(local_builds) == ["example_ops:default", "ppocr_cls:fp16", "ppocr_cls:fp32"]
    same_builds(local_builds, cluster_builds)
    # the variants' shared stages ran once on the cluster too
    assert cluster_builds["ppocr_cls:fp32"]["statuses"][:3] == ["cached", "cached", "cached"]
