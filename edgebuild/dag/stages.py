"""The stages of a variant's build, from DESIGN's data flow, assembled once per variant.

The core declares ``resolve``, ``import`` and ``optimize``; the backend those after it up to the
artifact; the core ``validate`` (:mod:`edgebuild.dag.validate`). Each is an
:class:`edgebuild.stage.Stage`: typed parameters built here from the validated recipe, and a
module-level body that reads nothing else. Here each stage also gets what its key names besides its
parameters: the plugins that registered what it may call (``uses``) and the versions of its
``libraries``. The executor does the caching.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from edgebuild.errors import UsageError
from edgebuild.recipe import Variant
from edgebuild.recipe.formats import scheme_of, source_format
from edgebuild.recipe.passes import pass_switches
from edgebuild.stage import Result, Stage, StageInputs, StageParams
from edgebuild.store.hashstate import file_sha256
from edgebuild.versions import edgebuild_version, library_versions

ONNX_MODEL = "model.onnx"  # what a frontend writes, unless it names another artifact
ONNX_LIBRARIES = ("onnx", "onnx-ir")  # every frontend writes its model with them


class SourceParams(StageParams):
    model: str
    sha256: str | None = None


class ImportParams(StageParams):
    format: str
    inputs: dict  # source.inputs, defaults applied
    options: Any = None  # the frontend's typed source.options section (its dump is in the key)
    option_files: dict[str, str] = {}  # local files the options name -> sha256


class OptimizeParams(StageParams):
    level: str = "O2"  # optimize.level: how much of onnxscript's folding and rewriting runs
    passes: dict[str, bool]  # every installed pass, on or off (the level's defaults applied)
    quantization: Any  # the recipe's typed quantization section


def import_stage(params: ImportParams, inputs: StageInputs, out: Path) -> dict:
    frontend = inputs.registry.get("frontends", params.format)
    return frontend.import_model(inputs.path("resolve"), params.inputs, out, options=params.options,
                                 base_dir=inputs.base_dir)


def optimize_stage(params: OptimizeParams, inputs: StageInputs, out: Path) -> dict:
    imported = inputs.path("import")
    made = inputs.info("import").get("artifact", ONNX_MODEL)
    if made != ONNX_MODEL:  # a frontend that converted straight to a backend's format: nothing to optimise
        shutil.copytree(imported, out, dirs_exist_ok=True)
        return {"passthrough": made}
    from edgebuild.graph.optimize import optimize

    return optimize(imported / ONNX_MODEL, out, params.passes, registry=inputs.registry,
                    quantization=params.quantization, level=params.level)


def _option_files(frontend, variant: Variant, options) -> list[Path]:
    """Local files a frontend's options name (e.g. a PyTorch config), if the frontend says."""
    if options is None:
        return []  # and the frontend's module stays unimported
    model = variant.recipe.source.model
    local = variant.base_dir / model.removeprefix("file:") if scheme_of(model) == "file" else None
    return list(frontend.option_files(options, local, variant.base_dir))


def _installed(registry, kind: str, name: str, field: str, hint: str):
    """The registered object, or a UsageError (a machine, such as a Dask worker, that lacks the plugin)."""
    found = registry.get(kind, name)
    if found is None:
        raise UsageError(f"{field} {name!r}: no installed plugin provides this {kind[:-1]} "
                         f"(installed: {', '.join(map(str, registry.names(kind))) or 'none'})", hint=hint)
    return found


def import_inputs(variant: Variant, frontend) -> dict:
    """``source.inputs`` with defaults applied; for a generative recipe whose frontend sizes a
    source's symbolic dims from the recipe (``sizes_derived_inputs = True``), also the sizes of the
    inputs the artifact feeds (input_ids' query length from generate.query_lengths), which
    ``source.inputs`` may not name. The recipe's own entries come last and win."""
    inputs = variant.params["source"]["inputs"]
    generate = variant.recipe.generate
    if generate is None or not getattr(frontend, "sizes_derived_inputs", False):
        return inputs
    from edgebuild.recipe.generate import derived_input_sizes

    given = "query_lengths" in generate.model_fields_set
    return {**derived_input_sizes(generate, lengths_given=given), **inputs}


def pipeline(variant: Variant, registry, resolve_source: Callable[[], Result]) -> list[Stage]:
    """The ordered stages of one variant."""
    recipe = variant.recipe
    source = variant.params["source"]
    fmt = source_format(recipe.source)
    frontend = _installed(registry, "frontends", fmt, "source.format",
                          "pip install the plugin for it (e.g. edgebuild-pytorch), then check `edgebuild plugins`")
    options = variant.section(f"{fmt}:source.options")
    option_files = _option_files(frontend, variant, options)
    stages = [
        Stage("resolve", SourceParams(model=recipe.source.model, sha256=recipe.source.sha256), [],
              resolve=resolve_source),
        Stage("import", ImportParams(format=fmt, inputs=import_inputs(variant, frontend), options=options,
                                     option_files={str(p): file_sha256(p) for p in option_files}),
              ["resolve"], import_stage, uses=("frontends",),
              libraries=(*ONNX_LIBRARIES, *frontend.libraries), extra={"files": option_files}),
        Stage("optimize", OptimizeParams(level=recipe.optimize.level,
                                         passes=pass_switches(recipe.optimize.passes, registry, recipe.optimize.level),
                                         quantization=recipe.quantization),
              ["import"], optimize_stage, uses=("passes",), libraries=(*ONNX_LIBRARIES, "onnxscript", "numpy")),
    ]
    backend = _installed(registry, "backends", recipe.target.backend, "target.backend",
                         "install the backend's plugin, then check `edgebuild plugins`")
    stages.extend(backend.stages(variant, registry))
    if recipe.validate_ is not None:
        from edgebuild.dag.validate_stage import validate_stage_of

        validate = validate_stage_of(variant, registry, backend, frontend, stages)
        if validate is not None:
            stages.append(validate)
    for stage in stages:
        stage.plugins = registry.plugins_for(stage.uses)
        stage.libraries_versions = library_versions(stage.libraries)
        stage.registry, stage.base_dir = registry, variant.base_dir
    return stages


def artifact_of(stages: list[Stage]) -> str:
    for stage in reversed(stages):
        if "artifact" in stage.extra:
            return stage.extra["artifact"]
    return ""


def versions(registry) -> dict[str, str]:
    return {"edgebuild": edgebuild_version(), **registry.versions()}
