"""The committed bundle manifest schema is current, and validates a manifest."""

from __future__ import annotations

import json

import pytest

from edgebuild.bundle import manifest as bundle


def test_committed_bundle_schema_is_current():
    assert bundle.SCHEMA_PATH.read_text() == bundle.schema_text(), \
        "regenerate: python -m edgebuild.bundle.manifest --out schemas/bundle.schema.json"


def _manifest() -> bundle.Manifest:
    tensor = bundle.TensorSpec(name="x", dtype="float32", shape=[1, 8])
    segment = bundle.SegmentSpec(index=0, backend="msl", path="segments/0_msl", compute_units="GPU",
                                 files={"source": "segments/0_msl/kernel.metal", "spec": "segments/0_msl/kernel.json"},
                                 inputs=[tensor], outputs=[tensor.model_copy(update={"name": "y"})])
    return bundle.Manifest(name="m", inputs=[tensor], outputs=[tensor.model_copy(update={"name": "y"})],
                           segments=[segment], handoffs=[bundle.HandOffSpec(tensor="x", to_segment=0),
                                                         bundle.HandOffSpec(tensor="y", from_segment=0)])


def test_manifest_round_trips_and_matches_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    manifest = _manifest()
    bundle.write_manifest(manifest, tmp_path)
    assert bundle.read_manifest(tmp_path) == manifest
    jsonschema.validate(json.loads((tmp_path / "manifest.json").read_text()), json.loads(bundle.schema_text()))
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["segments"][0]["inputs"][0]["dtype"] = "float8"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json.loads(bundle.schema_text()))


def test_other_versions_are_refused(tmp_path):
    from edgebuild.errors import BuildError

    (tmp_path / "manifest.json").write_text(json.dumps({"format": "edgebuild-bundle", "version": 2}))
    with pytest.raises(BuildError, match="version 1"):
        bundle.read_manifest(tmp_path)
