"""The resolve stage: the recipe's source model fetched (or found) and hashed, with its companion files."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from edgebuild import progress
from edgebuild.dag.stages import Result
from edgebuild.errors import UsageError
from edgebuild.recipe import Variant
from edgebuild.recipe.formats import source_format
from edgebuild.store import hashstate
from edgebuild.store.local import Store


def source_resolver(variant: Variant, registry, store: Store):
    from edgebuild.recipe.formats import scheme_of

    def resolve() -> Result:
        uri = variant.recipe.source.model
        scheme = scheme_of(uri)
        resolver = registry.get("resolvers", scheme)
        if resolver is None:
            raise UsageError(f"source.model: no installed resolver for {scheme!r} sources")
        start, wall = time.perf_counter(), time.time()
        if scheme != "file":
            progress.report(progress.STARTED, 0)  # a download may follow
        path = Path(resolver(uri, sha256=variant.recipe.source.sha256, workdir=store.sources,
                             base_dir=variant.base_dir))
        companions = source_files(registry, variant, path)
        if not all(hashstate.remembered(p) for p in (path, *companions)):
            progress.report(progress.STARTED, 0)  # files to hash: gigabytes take seconds
        digest = hashstate.file_sha256(path)  # remembered by stat, so this is free when unchanged
        fetched = scheme != "file" and path.stat().st_mtime >= wall - 1
        info = {"uri": uri, "sha256": digest}
        if companions:  # the model's content is these files too (its external data)
            info["files"] = {str(p.relative_to(path.parent)): _readable_digest(p, path) for p in companions}
            digest = hashlib.sha256(json.dumps([digest, info["files"]], sort_keys=True).encode()).hexdigest()
        return Result("resolve", digest, digest, path, info,
                      "ran" if fetched else "cached", round(time.perf_counter() - start, 3))

    return resolve


def _readable_digest(file: Path, model: Path) -> str:
    try:
        return hashstate.file_sha256(file)
    except OSError as exc:
        raise UsageError(f"{file}: the weight file {model.name} names cannot be read ({exc.strerror or exc})",
                         hint="check the file's permissions, or export the model again") from None


def source_files(registry, variant: Variant, path: Path) -> list[Path]:
    """The files beside the resolved source that its frontend counts as its content (see
    ``Frontend.source_files``); none for a frontend that does not say."""
    frontend = registry.get("frontends", source_format(variant.recipe.source))
    named = getattr(frontend, "source_files", None)
    return list(named(path)) if named is not None else []
