"""Command-line arguments checked before any build work: each mistake is a UsageError (exit 2)
that says what to give instead, not a traceback or a failure halfway through a build."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from edgebuild.errors import UsageError


def check_recipe_paths(paths) -> None:
    for path in map(Path, paths):
        if path.is_dir():
            raise UsageError(f"{path}: is a directory, not a recipe file",
                             hint=f"name the recipe inside it, e.g. {path / 'recipe.yaml'}")
        if not path.exists():
            raise UsageError(f"{path}: no such recipe file")


def check_depfile(depfile: Path | None) -> None:
    if depfile is None:
        return
    if depfile.is_dir():
        raise UsageError(f"--depfile {depfile}: is a directory; give the path of a file to write",
                         hint=f"e.g. --depfile {depfile / 'edgebuild.d'}")
    # a missing folder is made when the depfile is written; a file in its place is a mistake
    existing = next((p for p in depfile.absolute().parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"--depfile {depfile}: {existing} is a file, not a directory",
                         hint="give a depfile path in a directory, e.g. build/deps.d")


def check_cache_dir(cache_dir: Path | None) -> None:
    """The store's directory is a directory we can write (``--no-cache`` builds still open it)."""
    from edgebuild.store.location import cache_root

    root = cache_root(cache_dir)
    what = "--cache-dir" if cache_dir else ("EDGEBUILD_CACHE_DIR" if os.environ.get("EDGEBUILD_CACHE_DIR")
                                           else "the cache directory")
    hint = "give a writable directory with --cache-dir or EDGEBUILD_CACHE_DIR"
    if root.exists() and not root.is_dir():
        raise UsageError(f"{what} {root}: is a file, not a directory", hint=hint)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root, prefix=".write-probe."):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {root}: not writable ({exc.strerror or exc})", hint=hint) from None


def check_reference_file(reference: Path) -> None:
    """``verify --reference`` names a model file."""
    if not reference.exists():
        raise UsageError(f"--reference {reference}: no such file")
    if not reference.is_file():
        raise UsageError(f"--reference {reference}: is a directory; give the source .onnx model "
                         "(or a model a frontend reads, such as a .jaxexport)")


def check_reference(reference: Path, artifact: Path, runtime) -> None:
    """``verify --reference`` is an ONNX model whose inputs the artifact takes."""
    from edgebuild.recipe.model_inputs import NotOnnx, read_graph_inputs

    check_reference_file(reference)
    try:
        inputs = read_graph_inputs(reference)
    except (NotOnnx, OSError) as exc:
        raise UsageError(f"--reference {reference}: not an ONNX model ({exc})",
                         hint="give the .onnx file the artifact was built from") from None
    try:
        taken = runtime.input_names(artifact)
    except Exception as exc:
        raise UsageError(f"{artifact}: cannot read the artifact ({type(exc).__name__}: {exc})") from None
    if taken is None:  # the runtime cannot tell
        return
    source_of = {artifact_name: source for source, artifact_name in runtime.tensor_names(artifact)["inputs"].items()}
    taken = [source_of.get(name, name) for name in taken]
    feeds = {i.name for i in inputs}
    plain = {_plain(name) for name in feeds}  # a backend may rename inputs its format cannot spell
    missing = [name for name in taken if name not in feeds and _plain(name) not in plain]
    if missing:  # the artifact may take fewer (inputs fixed at build time), never others
        raise UsageError(
            f"--reference {reference} does not match {artifact}: the artifact takes input(s) "
            f"{', '.join(map(repr, missing))}, which the reference model does not have "
            f"(it has {', '.join(map(repr, sorted(feeds))) or 'none'})",
            hint="give the model the artifact was built from")


def _plain(name: str) -> str:
    return re.sub(r"\W", "_", name)
