"""The bundle format (a manifest and its segments) and the session that runs an artifact."""

from edgebuild.bundle.manifest import HandOffSpec, Manifest, SegmentSpec, TensorSpec, read_manifest, write_manifest
from edgebuild.bundle.session import InferenceSession

__all__ = ["HandOffSpec", "Manifest", "SegmentSpec", "TensorSpec", "read_manifest", "write_manifest",
           "InferenceSession"]
