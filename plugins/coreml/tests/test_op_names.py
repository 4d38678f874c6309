"""A package's bytes depend on its program alone: op names the MIL builder makes up do not count on
from what the process built before (another variant, the last rebuild in watch, a conversion
stopped half way)."""

from __future__ import annotations

from pathlib import Path

from coremltools.converters.mil import Builder
from onnx_cases import lower
from test_nonreplaceable_propagation import _conv_net, _package_bytes

from edgebuild_coreml.lowering import package


def _save(path: Path) -> dict[str, bytes]:
    package.save_mlpackage(lower(_conv_net(), target="iOS17"), path, target="iOS17", precision="float16",
                           metadata={}, consume=True)
    return _package_bytes(path)


def test_a_package_is_the_same_after_other_builds_moved_the_counters(tmp_path):
    first = _save(tmp_path / "first.mlpackage")
    for name in ("cast", "const", "conv"):  # what a build stopped half way would leave
        Builder.name_count[name] = Builder.name_count[name] + 5
    assert _save(tmp_path / "second.mlpackage") == first

