"""The Python API, for notebooks and scripts: the same build as ``edgebuild run``, typed results.

    import edgebuild

    result = edgebuild.build("recipes/orientation.yaml", variant="fp16")
    result.check()                      # raises BuildError / ValidationFailed like the CLI's exit codes
    print(result["fp16"].artifact, result["fp16"].validation.metrics)

A bad recipe raises :class:`edgebuild.errors.RecipeError` (file:line:column in its message). A
stage that fails, or thresholds that are missed, come back as ``status == "failed"`` with the
reason, so a notebook can look at the report; ``check()`` turns them into exceptions.

A script needs no ``if __name__ == "__main__":`` guard, whatever the multiprocessing start
method: the worker processes a build starts never import the caller's main module
(``edgebuild.worker_processes``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence, Union

from edgebuild.errors import BuildError, UsageError, ValidationFailed

RecipeLike = Union[str, os.PathLike, Mapping[str, Any], "LoadedRecipe"]


@dataclass(frozen=True)
class StageStatus:
    name: str
    key: str
    status: Literal["ran", "cached", "pulled"]  # pulled: taken from the remote cache
    seconds: float


@dataclass(frozen=True)
class Validation:
    """The validation record: per runtime, per output, per metric statistics (``{"min", "max", "mean", ...}``)."""

    samples: int
    reference: str
    metrics: dict[str, dict[str, dict[str, Any]]]  # runtime -> output -> metric -> statistics
    failures: tuple[str, ...]
    record: dict = field(repr=False, default_factory=dict)  # everything report.json holds

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class VariantResult:
    recipe: str
    variant: str
    status: Literal["built", "failed"]
    output_dir: Path
    artifact: Path | None
    stages: tuple[StageStatus, ...]
    validation: Validation | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "built"

    @property
    def report(self) -> Path:
        return self.output_dir / "report.html"


@dataclass(frozen=True)
class BuildResult:
    variants: tuple[VariantResult, ...]
    exit_code: int  # what ``edgebuild run`` would have exited with

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def artifacts(self) -> list[Path]:
        return [v.artifact for v in self.variants if v.artifact is not None]

    def __iter__(self) -> Iterator[VariantResult]:
        return iter(self.variants)

    def __len__(self) -> int:
        return len(self.variants)

    def __getitem__(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.variant == name:
                return v
        raise KeyError(f"no variant {name!r}; built: {', '.join(v.variant for v in self.variants)}")

    def check(self) -> "BuildResult":
        """Raise :class:`BuildError` (a stage failed) or :class:`ValidationFailed`; else return self."""
        for v in self.variants:
            if v.status == "failed" and (v.validation is None or v.validation.passed):
                raise BuildError(f"{v.recipe}:{v.variant}: {v.error or 'failed'}")
        failures = [f"{v.recipe}:{v.variant}: {f}" for v in self.variants if v.validation for f in v.validation.failures]
        if failures:
            raise ValidationFailed("validation thresholds not met:\n  " + "\n  ".join(failures))
        return self


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe file and its variants (``edgebuild.recipe.Variant``: ``.recipe`` is the pydantic model)."""

    path: Path
    variants: tuple

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    def __getitem__(self, name: str):
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r}; the recipe has {', '.join(self.names)}")


def load_recipe(recipe: str | os.PathLike | Mapping[str, Any], *, base_dir: str | os.PathLike | None = None) -> LoadedRecipe:
    """Load and validate a recipe file, or a recipe given as a dict (relative paths in it are
    taken from ``base_dir``, default the working directory). Raises ``RecipeError``."""
    from edgebuild.build.jobs import load_variants
    from edgebuild.registry import get_registry

    if isinstance(recipe, Mapping):
        with _recipe_file(recipe, Path(base_dir or ".")) as path:
            variants = load_variants([str(path)], None, get_registry())
            return LoadedRecipe(path, tuple(variants))
    path = Path(recipe)
    if not path.is_file():
        raise UsageError(f"{path}: no such recipe file")
    return LoadedRecipe(path.resolve(), tuple(load_variants([str(path)], None, get_registry())))


@contextlib.contextmanager
def _recipe_file(data: Mapping[str, Any], base_dir: Path):
    """A dict recipe as a hidden file in ``base_dir`` (where its relative paths point), removed after."""
    import yaml

    base_dir.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=base_dir, prefix=".edgebuild-recipe-", suffix=".yaml")
    try:
        with os.fdopen(handle, "w") as f:
            yaml.safe_dump(dict(data), f, sort_keys=False)
        yield Path(name).resolve()
    finally:
        os.unlink(name)


class _Quiet:
    """A console that prints nothing (the API returns what the CLI would print)."""

    def print(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def build(recipe: RecipeLike, variant: str | Sequence[str] | None = None, *, jobs: int = 1,
          cache_dir: str | os.PathLike | None = None, force: bool = False, no_cache: bool = False,
          base_dir: str | os.PathLike | None = None, progress: bool = False) -> BuildResult:
    """Build ``recipe`` (a path, a dict or a :class:`LoadedRecipe`) like ``edgebuild run``.

    ``variant`` picks one or several variants (default: all). ``progress=True`` prints the stage
    lines to stderr as the CLI does. Raises ``RecipeError`` for a recipe that does not validate.
    """
    if isinstance(recipe, Mapping):
        with _recipe_file(recipe, Path(base_dir or ".")) as path:
            return build(path, variant, jobs=jobs, cache_dir=cache_dir, force=force, no_cache=no_cache, progress=progress)
    path = recipe.path if isinstance(recipe, LoadedRecipe) else Path(recipe)
    if not path.is_file():
        raise UsageError(f"{path}: no such recipe file")
    from edgebuild.build.run import run_recipes
    from edgebuild.report.console import Printer

    variants = [variant] if isinstance(variant, str) else list(variant) if variant else None
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # run --json's object: the documented contract
        code = run_recipes([str(path)], variants=variants, jobs=jobs, cache_dir=cache_dir, no_cache=no_cache,
                           force=force, as_json=True, console=Printer() if progress else _Quiet())
    data = json.loads(stdout.getvalue().strip().splitlines()[-1])
    return BuildResult(tuple(_variant_result(v) for v in data["variants"]), code)


def _failure_text(failure) -> str:
    if isinstance(failure, Mapping):  # {"output", "runtime", "metric", "value", "limit"}
        return " ".join(f"{k}={failure[k]}" for k in ("output", "runtime", "metric", "value", "limit") if k in failure)
    return str(failure)


def _variant_result(v: dict) -> VariantResult:
    validation = v.get("validation") or None
    failures = tuple(_failure_text(f) for f in validation.get("failures", [])) if validation else ()
    error = v.get("error") or ("; ".join(map(str, failures)) if failures else None)
    return VariantResult(
        recipe=v["recipe"], variant=v["variant"],
        status="failed" if v["status"] == "failed" or failures else "built",
        output_dir=Path(v.get("output_dir") or ""),
        artifact=Path(v["artifacts"][0]) if v.get("artifacts") else None,
        stages=tuple(StageStatus(s["name"], s["key"], s["status"], s["seconds"]) for s in v.get("stages", [])),
        validation=Validation(
            samples=validation.get("samples", 0), reference=validation.get("reference", ""),
            metrics={name: r.get("metrics", {}) for name, r in validation.get("runtimes", {}).items()},
            failures=failures, record=validation,
        ) if validation else None,
        error=error,
    )
