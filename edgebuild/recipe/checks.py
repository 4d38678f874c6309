"""Checks of a loaded variant against what is installed and on disk, before any build work.

The pydantic models check each value on its own; these need more: the registry (is there a
backend, a pass, a chip of that name?), the source model (does it have the inputs the recipe
names, with that rank and dtype?) and the file system (do the validation files exist?). Every
problem is a RecipeError at the offending value's file:line:column, with the closest valid
name when there is one. ``edgebuild validate`` and ``edgebuild run`` both run them at load.
"""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path

from edgebuild.errors import RecipeError, UsageError
from edgebuild.first_party import missing_hint
from edgebuild.recipe.formats import source_format
from edgebuild.recipe.locations import locate


def closest(given, choices) -> str:
    """``; did you mean 'x'?`` for a near miss, else the list of valid names."""
    choices = [str(c) for c in choices]
    lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(str(given).lower(), list(lower), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {lower[close[0]]!r}?"
    return f"; valid: {', '.join(sorted(choices))}" if choices else "; none is installed"


class _Checker:
    def __init__(self, variant):
        self.variant = variant
        self.suffix = f"\n  (in variant {variant.name!r})" if variant.name != "default" else ""

    def fail(self, path: tuple, message: str, *, key: bool = False, hint: str | None = None):
        where = locate(self.variant.locations, path, key=key) or self.variant.path.name
        dotted = ".".join(str(p) for p in path)
        raise RecipeError(f"{where} {dotted}: {message}{self.suffix}", hint=hint)


def check_variant(variant, registry) -> None:
    """Every check of this module; raises the first RecipeError found."""
    check = _Checker(variant)
    fmt = _check_source(check, variant, registry)
    _check_backend(check, variant, registry)
    _check_passes(check, variant, registry)
    inputs = _model_inputs(check, variant) if fmt == "onnx" else None
    if inputs is not None:
        _check_inputs_match_model(check, variant, inputs)
    _check_validation(check, variant, inputs)
    _check_generate(check, variant, inputs)


def _check_source(check: _Checker, variant, registry) -> str | None:
    from edgebuild.recipe.formats import scheme_of

    source = variant.recipe.source
    try:
        scheme = scheme_of(source.model)
    except UsageError as exc:
        check.fail(("source", "model"), exc.message.removeprefix("source.model: "))
    if scheme in ("pypi", "https") and not source.sha256:
        check.fail(("source", "model"), f"a {scheme}: source needs source.sha256, the digest of the file it names",
                   hint="add source.sha256: <64 hex digits> (sha256sum of the file); a download that does not "
                        "match it is refused, as pip's hash-checking mode does")
    if scheme == "file":
        path = Path(source.model.removeprefix("file:"))
        path = path if path.is_absolute() else variant.base_dir / path
        if not path.is_file():
            problem = f"{source.model!r} is a directory, not a model file" if path.is_dir() else f"no such file {source.model!r}"
            check.fail(("source", "model"), f"{problem} (looked at {os.path.relpath(path)})")
    formats = sorted(registry.names("frontends"))
    try:
        fmt = source_format(source)
    except UsageError:
        check.fail(("source", "model"), f"cannot tell the format of {source.model!r} from its name",
                   hint=f"set source.format to one of the installed formats: {', '.join(formats)}")
    if registry.get("frontends", fmt) is None:
        check.fail(("source", "format") if source.format else ("source", "model"),
                   f"no installed plugin reads {fmt!r} models" + closest(fmt, formats),
                   hint=missing_hint("frontends", fmt)
                   or f"installed formats: {', '.join(formats) or 'none'}; pip install the plugin for "
                      f"{fmt!r} models, then check `edgebuild plugins`")
    return fmt if scheme == "file" else None  # remote sources are not fetched to check them


def _check_backend(check: _Checker, variant, registry) -> None:
    name = variant.recipe.target.backend
    backend = registry.get("backends", name)
    if backend is None:
        provided = missing_hint("backends", name)  # a first-party plugin that is not installed
        check.fail(("target", "backend"), f"no installed plugin provides backend {name!r}"
                   + ("" if provided else closest(name, registry.names("backends"))), hint=provided)
    else:  # names only the backend knows: chips, rewrites
        try:
            backend.check_recipe(variant.recipe)
        except RecipeError as exc:
            if exc.path is None:
                raise
            check.fail(exc.path, exc.message, hint=exc.hint)
        section = variant.recipe.validate_
        offered = backend.validation_runtimes
        for index, runtime in enumerate((section.runtimes or []) if section is not None else []):
            if runtime not in offered:
                check.fail(("validate", "runtimes", index), f"backend {name!r} has no validation runtime {runtime!r}"
                           + (closest(runtime, offered) if offered else "; it names none"))


def _check_passes(check: _Checker, variant, registry) -> None:
    """The only check of the names in optimize.passes (the optimize stage trusts them)."""
    from edgebuild.recipe.passes import installed_passes, unknown_passes

    for name in unknown_passes(variant.recipe.optimize.passes, registry):
        near = closest(name, registry.names("passes"))
        check.fail(("optimize", "passes", name),
                   f"unknown pass {name!r}" + (near + " installed" if "did you mean" in near else "; installed")
                   + f" passes: {installed_passes(registry)}", key=True,
                   hint="`edgebuild plugins` lists the passes each plugin registers")


def _model_inputs(check: _Checker, variant):
    from edgebuild.recipe.model_inputs import NotOnnx

    model = variant.recipe.source.model.removeprefix("file:")
    path = Path(model) if Path(model).is_absolute() else variant.base_dir / model
    try:
        stat = path.stat()
        return list(_graph_inputs(str(path.resolve()), (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)))
    except NotOnnx as exc:
        check.fail(("source", "model"), f"{model!r} is not an ONNX model ({exc})")
    except OSError as exc:
        check.fail(("source", "model"), f"cannot read {model!r}: {exc.strerror or exc}")


@functools.lru_cache(maxsize=32)
def _graph_inputs(path: str, signature: tuple) -> tuple:
    """The model's inputs, read once for all the variants that build it (a recipe may have
    thousands); ``signature`` (inode, size, mtime, ctime) makes a changed file read again."""
    from edgebuild.recipe.model_inputs import read_graph_inputs

    return tuple(read_graph_inputs(Path(path)))


def _check_inputs_match_model(check: _Checker, variant, graph_inputs) -> None:
    from edgebuild.recipe.input_names import first_unnamed, unnamed_input_message

    unnamed = first_unnamed(i.name for i in graph_inputs)
    if unnamed is not None:
        message, hint = unnamed_input_message(variant.recipe.source.model, unnamed, len(graph_inputs))
        check.fail(("source", "model"), message, hint=hint)
    by_name = {i.name: i for i in graph_inputs}
    for name, spec in variant.recipe.source.inputs.items():
        path = ("source", "inputs", name)
        model = by_name.get(name)
        if model is None:
            check.fail(path, f"the model has no input {name!r}" + closest(name, by_name), key=True)
        fixed = spec.value is not None
        if not fixed and model.dtype is not None and model.dtype != spec.dtype:
            said = "says" if "dtype" in _raw_input(variant, name) else "defaults to"
            check.fail(path + (("dtype",) if said == "says" else ()),
                       f"the model takes {model.dtype}, the recipe {said} {spec.dtype}",
                       hint=f"write dtype: {model.dtype}")
        if model.dims is None:
            continue
        rank = len(spec.dims) if spec.shape is not None else (_rank(spec.value) if fixed else None)
        if rank is not None and rank != len(model.dims):
            where = path + ("shape",) if spec.shape is not None else path + ("value",)
            check.fail(where, f"{rank} dims given, the model's input has rank {len(model.dims)} "
                              f"({_show_dims(model.dims)})", hint="give one entry per dimension")
        for axis, (model_dim, dim) in enumerate(zip(model.dims, spec.dims or ())):
            static = model_dim if isinstance(model_dim, int) and model_dim > 0 else None
            if static is not None and dim != static:
                check.fail(path + ("shape", axis), f"dim {axis} is fixed to {static} in the model, the recipe "
                           f"asks for {dim if isinstance(dim, (int, str)) else 'a flexible size'}",
                           hint=f"use {static}, or re-export the model with a dynamic axis")


def _rank(value) -> int:
    """numpy.ndim of a nested list, without importing numpy (a cached run never needs it)."""
    rank = 0
    while isinstance(value, (list, tuple)):
        rank += 1
        value = value[0] if value else None
    return rank


def _raw_input(variant, name) -> dict:
    spec = ((variant.data.get("source") or {}).get("inputs") or {}).get(name)
    return spec if isinstance(spec, dict) else {}


def _show_dims(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _check_validation(check: _Checker, variant, graph_inputs) -> None:
    section = variant.recipe.validate_
    if section is None:
        return
    _check_generation(check, variant, section)
    names = [i.name for i in graph_inputs] if graph_inputs is not None else None
    for name, source in section.inputs.items():
        path = ("validate", "inputs", name)
        if names is not None and name not in names and source.kind != "value":
            check.fail(path, f"the model has no input {name!r}" + closest(name, names), key=True)
        if source.file is not None:
            file = variant.base_dir / source.file
            if not file.is_file():
                problem = "is a directory, not a .npy/.npz file" if file.is_dir() else "no such file"
                check.fail(path + ("file",), f"{problem} ({source.file!r}, relative to the recipe)")
        if source.images is not None:
            folder = variant.base_dir / source.images.dir
            if not folder.is_dir():
                check.fail(path + ("images", "dir"), f"no such directory ({source.images.dir!r}, relative to the recipe)")


def _check_generate(check: _Checker, variant, graph_inputs) -> None:
    """The generate section: a stateful target, and cache names the source has (when it was read)."""
    from edgebuild.recipe.generate import check_generate
    from edgebuild.recipe.model_inputs import read_graph_outputs

    if variant.recipe.generate is None:
        return
    inputs = outputs = None
    if graph_inputs is not None:
        inputs = [i.name for i in graph_inputs if not i.initializer]
        model = variant.recipe.source.model.removeprefix("file:")
        outputs = read_graph_outputs(Path(model) if Path(model).is_absolute() else variant.base_dir / model)
    try:
        check_generate(variant.recipe, inputs, outputs)
    except RecipeError as exc:
        check.fail(exc.path, exc.message, hint=exc.hint)

def _check_generation(check: _Checker, variant, section) -> None:
    """A generative recipe is validated by generation, only it is, and the tokenizer file exists."""
    generation = section.generation
    generative = getattr(variant.recipe, "generate", None) or (variant.data or {}).get("generate")
    if generation is None:
        if generative:
            check.fail(("validate",), "a generative recipe (generate:) is validated by generation, and "
                       "validate.generation is missing", key=True,
                       hint="add validate.generation: {prompts: [[token ids], ...], new_tokens: 16}")
        return
    if not generative:
        check.fail(("validate", "generation"), "validation by generation needs a generative recipe",
                   key=True, hint="add a generate: section (max_context, query_lengths), or remove validate.generation")
    prompts = generation.prompts
    if not isinstance(prompts, list) and not (variant.base_dir / prompts.tokenizer).is_file():
        check.fail(("validate", "generation", "prompts", "tokenizer"),
                   f"no such file ({prompts.tokenizer!r}, relative to the recipe)")
