"""The stages of a variant's build, from DESIGN's data flow.

Each stage declares its parameters (after defaults), the upstream stages it reads, the
plugins whose code produces it (their versions go into the cache key) and a ``produce``
function writing into an empty output directory. The executor does the caching.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgebuild.versions import edgebuild_version
from edgebuild.errors import UsageError
from edgebuild.stage import Result  # noqa: F401  (what stage bodies hand downstream)
from edgebuild.recipe import Variant
from edgebuild.store.hashstate import file_sha256

ONNX_MODEL = "model.onnx"  # what a frontend writes, unless it names another artifact
from edgebuild.recipe.formats import source_format


@dataclass
class Stage:
    name: str
    params: dict
    deps: list[str]
    plugins: dict[str, str]
    produce: Callable[[dict[str, Result], Path], dict] | None = None
    resolve: Callable[[], Result] | None = None  # stages outside the store (source resolution)
    extra: dict = field(default_factory=dict)


def _plugin(registry, kind: str, name) -> dict[str, str]:
    info = registry.plugin_of(kind, name)
    return {info.distribution or info.name: info.version} if info else {}


def _import(frontend, path: Path, inputs: dict, options, out: Path, base_dir: Path) -> dict:
    return frontend.import_model(path, inputs, out, options=options, base_dir=base_dir)


def _option_files(frontend, variant: Variant, options) -> list[Path]:
    """Local files a frontend's options name (e.g. a PyTorch config), if the frontend says."""
    if options is None:
        return []  # and the frontend's module stays unimported
    from edgebuild.recipe.formats import scheme_of

    model = variant.recipe.source.model
    local = variant.base_dir / model.removeprefix("file:") if scheme_of(model) == "file" else None
    return list(frontend.option_files(options, local, variant.base_dir))


def pipeline(variant: Variant, registry, resolve_source: Callable[[], Result]) -> list[Stage]:
    """The ordered stages of one variant."""
    recipe = variant.recipe
    source = variant.params["source"]
    fmt = source_format(recipe.source)
    frontend = registry.get("frontends", fmt)
    if frontend is None:
        raise UsageError(
            f"source.format {fmt!r}: no installed plugin provides this frontend",
            hint="pip install the plugin for it (e.g. edgebuild-pytorch), then check `edgebuild plugins`",
        )
    stages = [Stage("resolve", {"model": recipe.source.model, "sha256": recipe.source.sha256}, [], {}, resolve=resolve_source)]
    options = variant.section(f"{fmt}:source.options")
    import_params = {"format": fmt, "inputs": source["inputs"], "options": source["options"]}
    option_files = _option_files(frontend, variant, options)
    if option_files:
        import_params["option_files"] = {str(p): file_sha256(p) for p in option_files}
    stages.append(Stage(
        "import", import_params, ["resolve"], _plugin(registry, "frontends", fmt),
        produce=lambda r, out: _import(frontend, r["resolve"].path, source["inputs"], options, out, variant.base_dir),
        extra={"files": option_files},
    ))
    passes = {name: recipe.optimize.passes.get(name, entry.obj.default)
              for name, entry in registry.tables["passes"].items()}
    unknown = sorted(set(recipe.optimize.passes) - set(passes))
    if unknown:
        raise UsageError(f"optimize.passes: unknown pass {unknown[0]!r}; installed passes: {', '.join(sorted(passes))}")
    pass_plugins = {}
    for name in passes:
        pass_plugins.update(_plugin(registry, "passes", name))

    def optimize(r, out):
        imported = r["import"].path
        made = r["import"].info.get("artifact", ONNX_MODEL)
        if made != ONNX_MODEL:  # a frontend that converted straight to a backend's format: nothing to optimise
            shutil.copytree(imported, out, dirs_exist_ok=True)
            return {"passthrough": made}
        from edgebuild.graph.optimize import optimize as run_optimize
        return run_optimize(imported / "model.onnx", out, passes, registry=registry, quantization=quantization)

    quantization = variant.params["quantization"]
    stages.append(Stage("optimize", {"passes": passes, "quantization": quantization}, ["import"], pass_plugins,
                        produce=optimize))

    backend_name = recipe.target.backend
    backend = registry.get("backends", backend_name)
    if backend is None:
        raise UsageError(
            f"target.backend {backend_name!r}: no installed plugin provides this backend "
            f"(installed: {', '.join(map(str, registry.names('backends'))) or 'none'})",
        )
    backend_plugins = _plugin(registry, "backends", backend_name)
    stages.extend(backend.stages(variant, registry, backend_plugins))
    return stages


def artifact_of(stages: list[Stage]) -> str:
    for stage in reversed(stages):
        if "artifact" in stage.extra:
            return stage.extra["artifact"]
    return ""


def versions(registry) -> dict[str, str]:
    return {"edgebuild": edgebuild_version(), **registry.versions()}
