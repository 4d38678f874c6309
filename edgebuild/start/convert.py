"""``edgebuild convert MODEL -o OUT.mlpackage``: ``ct.convert``'s one call, as a recipe.

Beside ``OUT`` (say ``Net.mlpackage``) convert keeps what makes the build reproducible and
cached like any other:

    Net.mlpackage          the package (hard links to the build directory's copy)
    Net.edgebuild.yaml     the recipe it used; ``edgebuild run Net.edgebuild.yaml`` rebuilds it
    Net.edgebuild/         the recipe's outputs.dir: default/ (package, report.html, lock file)
                           and convert.json, the record of what convert wrote

``OUT`` is replaced only when that record says convert wrote it (same inode); a path it did not
create is refused (exit 2), never deleted. A package that misses its validation thresholds is
left in the build directory with its report, and ``OUT`` is not touched (exit 3).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from edgebuild.errors import UsageError

RECIPE_MARK = "# written by `edgebuild convert`"
RECORD = "convert.json"
VARIANT = "default"
DEFAULT_TARGET = "iOS17"
TARGET_ORDER = ("iOS15", "iOS16", "iOS17", "iOS18", "iOS26")
PRECISIONS = {"fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32"}
# preset -> (compression section, lowest deployment target that expresses it)
PRESETS = {
    "int8": ({"weights": {"mode": "linear", "dtype": "int8", "granularity": "per_channel"}}, "iOS16"),
    "int4": ({"weights": {"mode": "linear", "dtype": "int4", "granularity": "per_block", "block_size": 32}}, "iOS18"),
    **{f"palettize{n}": ({"weights": {"mode": "palettize", "nbits": n}}, "iOS18" if n == 3 else "iOS16")
       for n in (1, 2, 3, 4, 6, 8)},
    "prune50": ({"weights": {"mode": "prune", "method": "magnitude", "target_sparsity": 0.5}}, "iOS16"),
}
THRESHOLDS = {"float32": {"cosine_min": 0.9999}, "float16": {"cosine_min": 0.999}}
COMPRESSED_THRESHOLDS = {"cosine_min": 0.9}  # catches a broken package; tighten for your use


class Layout:
    """The paths convert owns for one output."""

    def __init__(self, out: Path, artifact: str):
        self.out = out
        suffix = Path(artifact).suffix
        stem = out.name[: -len(suffix)] if suffix else out.name
        self.recipe = out.with_name(f"{stem}.edgebuild.yaml")
        self.build_dir = out.with_name(f"{stem}.edgebuild")
        self.record = self.build_dir / RECORD
        self.variant_dir = self.build_dir / VARIANT  # the report and lock file; the artifact inside it
        self.built = self.variant_dir / artifact if artifact else self.variant_dir

    def read_record(self) -> dict | None:
        try:
            return json.loads(self.record.read_text())
        except (OSError, ValueError):
            return None

    def check_ownership(self) -> None:
        """Refuse (exit 2) when any path convert would write exists and convert did not write it."""
        record = self.read_record()
        if self.build_dir.exists() and (record is None or not self.build_dir.is_dir()):
            raise UsageError(f"{_shown(self.build_dir)} exists and was not made by edgebuild convert; it is left alone",
                             hint="choose another -o, or move it away")
        if self.recipe.exists() or self.recipe.is_symlink():
            first = self.recipe.read_text(errors="replace").split("\n", 1)[0] if self.recipe.is_file() else ""
            if self.recipe.is_symlink() or first != RECIPE_MARK:
                raise UsageError(f"{_shown(self.recipe)} exists and was not written by edgebuild convert; it is left alone",
                                 hint="choose another -o, or move the file away")
        if self.out.exists() or self.out.is_symlink():
            if not self._owns_output(record):
                raise UsageError(f"{_shown(self.out)} exists and was not written by edgebuild convert; it is left alone",
                                 hint="choose another -o, or remove it yourself if it may go")

    def _owns_output(self, record: dict | None) -> bool:
        if record is None or self.out.is_symlink() or not self.out.is_dir():
            return False
        st = self.out.stat()
        return record.get("output") == self.out.name and record.get("inode") == [st.st_dev, st.st_ino]

    def claim(self) -> None:
        """Make the build directory and its record before anything is written into it."""
        self.build_dir.mkdir(parents=True, exist_ok=True)
        if self.read_record() is None:
            self._write_record({"output": self.out.name})

    def _write_record(self, record: dict) -> None:
        from edgebuild.store.atomic import write_text_atomic

        write_text_atomic(self.record, json.dumps(record, indent=2) + "\n")

    def place(self) -> bool:
        """Put the built package at ``out`` (hard links); False when it was already there."""
        from edgebuild.store.lockfile import LOCK_NAME
        from edgebuild.store.atomic import atomic_dir
        from edgebuild.store.links import link_or_copy

        lock = (self.variant_dir / LOCK_NAME).read_text()
        record = self.read_record() or {}
        if self._owns_output(record) and record.get("lock") == lock:
            return False
        if (self.out.exists() or self.out.is_symlink()) and not self._owns_output(record):  # made during the build
            raise UsageError(f"{_shown(self.out)} appeared during the build and is left alone",
                             hint=f"the package is in {_shown(self.built)}")
        with atomic_dir(self.out) as tmp:
            shutil.rmtree(tmp)
            shutil.copytree(self.built, tmp, copy_function=link_or_copy)
        st = self.out.stat()
        self._write_record({"output": self.out.name, "inode": [st.st_dev, st.st_ino], "lock": lock})
        return True


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def options(precision: str, compress: str | None, deployment_target: str | None) -> tuple[str, dict | None, str]:
    """(target precision, compression section, deployment target) from the command line."""
    if precision.lower() not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: use fp16 or fp32")
    section, needs = (None, DEFAULT_TARGET)
    if compress is not None:
        if compress.lower() not in PRESETS:
            raise UsageError(f"--compress {compress!r}: use one of {', '.join(PRESETS)}",
                             hint="for other settings edit the compression section of the written recipe")
        section, needs = PRESETS[compress.lower()]
    target = deployment_target or max(DEFAULT_TARGET, needs, key=TARGET_ORDER.index)
    return PRECISIONS[precision.lower()], section, target


def recipe_text(started, layout: Layout, precision: str, compression: dict | None, target: str, argv: str) -> str:
    from edgebuild.start.init import header, model_reference
    from edgebuild.start.render import render

    thresholds = COMPRESSED_THRESHOLDS if compression else THRESHOLDS[precision]
    lines = [f"  {argv}",
             f"  edgebuild run {layout.recipe.name}     # the same build; outputs in {layout.build_dir.name}/{VARIANT}/"]
    if compression:
        lines.append(f"compressed: cosine_min {thresholds['cosine_min']} only catches a broken package; tighten it for your use")
    text = render(started.suggestion, model=model_reference(started, layout.recipe), sha256=started.sha256,
                  header=header(started, layout.recipe, lines), outputs_dir=layout.build_dir.name,
                  precision=precision, deployment_target=target, compression=compression, thresholds=thresholds)
    return f"{RECIPE_MARK}\n{text}"


def convert(model: str, out: Path, *, precision: str = "fp16", compress: str | None = None,
            deployment_target: str | None = None, cache_dir=None, console, sha256: str | None = None) -> int:
    """Write the recipe beside ``out``, build it, put the package at ``out``. Returns the exit code."""
    from edgebuild.build.run import run_recipes
    from edgebuild.report.console import compression_summary, escape
    from edgebuild.start.init import start, write_recipe

    from edgebuild.registry import get_registry

    out = Path(out)
    registry = get_registry()
    artifact = registry.get("backends", registry.default_backend()).artifact  # Core ML: model.mlpackage
    if out.suffix != Path(artifact).suffix:
        raise UsageError(f"-o {out}: convert writes what the default backend builds; name it *{Path(artifact).suffix}")
    precision, compression, target = options(precision, compress, deployment_target)
    layout = Layout(out.absolute(), artifact)
    layout.check_ownership()
    started = start(model, cache_dir, sha256, report_check=False)
    argv = f"edgebuild convert {model} -o {out} --precision {'fp16' if precision == 'float16' else 'fp32'}" + (
        f" --sha256 {sha256}" if sha256 else "") + (
        f" --compress {compress}" if compress else "") + (f" --deployment-target {deployment_target}" if deployment_target else "")
    text = recipe_text(started, layout, precision, compression, target, argv)
    layout.claim()
    write_recipe(text, layout.recipe, replace=True)
    code = run_recipes([str(layout.recipe)], cache_dir=cache_dir, console=console)
    if code != 0:
        where = layout.variant_dir
        console.print(f"[red]not written[/] {_shown(out)}: the build did not pass"
                      + (f"; see {_shown(where / 'report.html')}" if (where / "report.html").exists() else ""))
        return code
    layout.place()
    compressed = compression_summary(layout.variant_dir / "report.json") if compression else None
    console.print(f"[bold]{_shown(out)}[/]  ({escape(compressed) + '; ' if compressed else ''}"
                  f"recipe: {_shown(layout.recipe)}, report: {_shown(layout.variant_dir / 'report.html')})")
    return 0
