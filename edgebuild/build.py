"""``edgebuild run``: recipes -> variants -> stage chains -> store -> output directories."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from edgebuild.dag import hashstate
from edgebuild.dag.atomic import make_temp_dir, publish_tree, replace_path, write_text_atomic
from edgebuild.dag.executor import Executor, Job
from edgebuild.dag.stages import Result, Stage, artifact_of, pipeline, versions
from edgebuild.dag.store import Store, seal
from edgebuild.errors import UsageError
from edgebuild.recipe import Variant, load_recipe

LOCK_NAME = "edgebuild.lock.json"
OWNER_MARKER = ".edgebuild-output"  # in every output directory edgebuild made; only those it replaces
MARKER_TEXT = ("This directory was written by edgebuild, which replaces it on every build.\n"
               "Delete this file to keep edgebuild from ever replacing it.\n")
REPORT_FILES = ("report.json", "report.html")


def cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser().resolve()
    if os.environ.get("EDGEBUILD_CACHE_DIR"):
        return Path(os.environ["EDGEBUILD_CACHE_DIR"]).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild"))


def open_store(cache_dir=None) -> Store:
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    hashstate.configure(root / "state.db")
    return Store(root)


def validate_sections(variant: Variant, registry) -> None:
    """Let the plugins that own sections (compression, target.options, ...) validate them."""
    from edgebuild.recipe.sections import validate_plugin_sections

    validate_plugin_sections(variant, registry)


def load_variants(paths: list[str], only: list[str] | None, registry) -> list[Variant]:
    variants = []
    for path in paths:
        variants.extend(load_recipe(path, only=only or None, sections=lambda v: validate_sections(v, registry)))
    return variants


def source_resolver(variant: Variant, registry, store: Store):
    from edgebuild.graph.resolvers import scheme_of

    def resolve() -> Result:
        uri = variant.recipe.source.model
        scheme = scheme_of(uri)
        resolver = registry.get("resolvers", scheme)
        if resolver is None:
            raise UsageError(f"source.model: no installed resolver for {scheme!r} sources")
        start, wall = time.perf_counter(), time.time()
        path = Path(resolver(uri, sha256=variant.recipe.source.sha256, workdir=store.root / "sources",
                             base_dir=variant.base_dir))
        digest = hashstate.file_sha256(path)  # remembered by stat, so this is free when unchanged
        fetched = scheme != "file" and path.stat().st_mtime >= wall - 1
        return Result("resolve", digest, digest, path, {"uri": uri, "sha256": digest},
                      "ran" if fetched else "cached", round(time.perf_counter() - start, 3))

    return resolve


@dataclass
class Build:
    variant: Variant
    job: Job
    output_dir: Path
    artifact: str
    written: bool = False  # the output directory was (re)written by this run
    outputs_root: Path | None = None  # outputs.dir, resolved; output_dir must stay inside it


def plan_jobs(variants: list[Variant], registry, store: Store) -> list[Build]:
    """The builds, once every output directory is known safe to replace (exit 2 otherwise,
    before any build work)."""
    builds = []
    for variant in variants:
        stages = pipeline(variant, registry, source_resolver(variant, registry, store))
        job = Job(f"{variant.recipe.name}:{variant.name}", stages)
        root, output_dir = output_location(variant)
        build = Build(variant, job, output_dir, artifact_of(stages), outputs_root=root)
        check_output_dir(build, reads=planned_inputs(build), store_root=store.root)
        builds.append(build)
    return builds


# -- output directories: edgebuild replaces only what it made ----------------------------

def output_location(variant: Variant) -> tuple[Path, Path]:
    """(outputs.dir, <outputs.dir>/<variant>). outputs.dir may sit behind a symlink (a build
    volume), so it is resolved; the variant directory is not: it is what gets replaced, and a
    symlink there is refused rather than followed."""
    root = (variant.base_dir / (variant.recipe.outputs.dir or f"build/{variant.recipe.name}")).resolve()
    return root, Path(os.path.normpath(root / variant.name))


def planned_inputs(build: Build, source: Path | None = None) -> list[Path]:
    """Files outside the store whose content the build reads: the recipe and the recipes it
    extends, a local source model (``source`` once resolved), files the stages declare,
    validation inputs (and their image folders). Known before the build runs."""
    from edgebuild.graph.resolvers import scheme_of
    from edgebuild.verify.files import input_paths

    variant = build.variant
    paths = [variant.path, *variant.includes]
    model = variant.recipe.source.model
    if source is None and scheme_of(model) == "file":
        source = variant.base_dir / model.removeprefix("file:")
    if source is not None:
        paths.append(source)
    for stage in build.job.stages:
        paths += stage.extra.get("files", [])  # e.g. a config file the frontend's options name
    return paths + input_paths(variant.recipe.validate_, variant.base_dir)


def _refuse(build: Build, problem: str, fix: str, field: str = "outputs.dir"):
    raise UsageError(f"{_shown(build.variant.path)}: {field}: {problem}", hint=fix)


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def check_output_dir(build: Build, reads: list[Path] = (), store_root: Path | None = None) -> None:
    """Refuse (exit 2, with the fix) an output directory edgebuild may not replace: outside
    outputs.dir, ``/``, a symlink or file, one holding the recipe, a source or the store, or an
    existing directory edgebuild did not make. Checked when planning and again before replacing."""
    root, out = build.outputs_root, build.output_dir
    other = "choose another outputs.dir (or variant name)"
    if root is None:
        root, out = output_location(build.variant)
    if root.parent == root:
        _refuse(build, f"{str(root)!r} is the file system root; edgebuild will not write variant directories there",
                "set outputs.dir to a directory of its own, e.g. build/" + build.variant.recipe.name)
    if out.parent != root:
        _refuse(build, f"variant {build.variant.name!r} would write {_shown(out)}, outside {_shown(root)}",
                "rename the variant: a plain name, no '/' or '..'", field="variants")
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        _refuse(build, f"{_shown(existing)} is a file, not a directory", f"remove or rename that file, or {other}")
    for path in reads:
        path = Path(path).resolve()
        if path == out or out in path.parents:
            _refuse(build, f"{_shown(out)} holds {_shown(path)}, which the build reads; "
                    "edgebuild replaces its output directories whole", f"{other}, so it does not contain it")
    store = Path(store_root).resolve() if store_root is not None else None
    if store is not None and (store == out or out in store.parents or store in out.parents):
        _refuse(build, f"{_shown(out)} overlaps the cache {_shown(store)}", f"{other}, outside the cache")
    if out.is_symlink():
        _refuse(build, f"{_shown(out)} is a symlink; edgebuild never writes through one",
                f"remove the link (rm {_shown(out)}), or {other}")
    if out.exists() and not out.is_dir():
        _refuse(build, f"{_shown(out)} is a file, not a directory edgebuild made", f"remove it, or {other}")
    if out.is_dir() and not owned(out):
        _refuse(build, f"{_shown(out)} exists and was not made by edgebuild (no {OWNER_MARKER} in it); "
                "edgebuild would replace it whole", f"remove it (after saving what you need), or {other}")


def owned(out: Path) -> bool:
    """Whether edgebuild may replace ``out``: it holds the marker edgebuild writes, or is empty, or
    holds only what an earlier edgebuild (before the marker) wrote: lock file, reports, artifact."""
    marker = out / OWNER_MARKER
    if marker.is_file() and not marker.is_symlink():
        return True
    try:
        names = {p.name for p in out.iterdir()}
    except OSError:
        return False
    if not names:
        return True
    lock = read_lock(out)
    artifact = lock.get("artifact") if isinstance(lock, dict) else None
    if not isinstance(artifact, str) or (out / LOCK_NAME).is_symlink():
        return False
    return names <= {LOCK_NAME, *REPORT_FILES, *Path(artifact).parts[:1]}


def settle_artifact(build: Build) -> None:
    """The artifact stage may report what it actually made (``info["artifact"]``): a bundle
    whose model Core ML runs whole is a plain ``model.mlpackage``."""
    for stage in reversed(build.job.stages):
        if stage.extra.get("artifact") and stage.name in build.job.results:
            build.artifact = build.job.results[stage.name].info.get("artifact", build.artifact)
            return


def lock_data(build: Build, registry) -> dict:
    stages = {}
    for stage in build.job.stages:
        result = build.job.results.get(stage.name)
        if result is None:
            continue
        stages[stage.name] = {
            "key": result.key, "digest": result.digest, "params": stage.params,
            "inputs": {d: build.job.results[d].digest for d in stage.deps}, "plugins": stage.plugins,
        }
    return {
        "recipe": build.variant.recipe.name, "variant": build.variant.name,
        "versions": versions(registry), "stages": stages, "artifact": build.artifact,
    }


def read_lock(output_dir: Path) -> dict | None:
    try:
        return json.loads((output_dir / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return None


def materialise(build: Build, registry, report_data: dict) -> bool:
    """Write the variant's output directory in one rename: artifact, reports, lock file, marker.

    Returns False when the directory was already up to date and left alone."""
    out = build.output_dir
    check_output_dir(build)  # again: the directory may have changed since planning
    lock = lock_data(build, registry)
    final = build.job.stages[-1].name
    for stage in reversed(build.job.stages):
        if stage.extra.get("artifact"):
            final = stage.name
            break
    source = build.job.results[final].path / build.artifact if build.artifact else None
    previous = read_lock(out)
    # (edgebuild.verify.report's names; not imported: it loads numpy, which a cached run need not)
    complete = all((out / name).exists() for name in (build.artifact, "report.json", "report.html"))
    if (previous is not None and previous.get("stages") == lock["stages"] and complete
            and (source is None or _delivered(source, out / build.artifact))):
        return False  # nothing changed: leave the directory (and its timestamps, for make) alone
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, f".{out.name}.", ".tmp")
    try:
        if source is not None and source.exists():
            if source.is_dir():
                shutil.copytree(source, tmp / build.artifact, copy_function=_link_or_copy)
            else:
                _link_or_copy(source, tmp / build.artifact)
        publish_tree(tmp)
        from edgebuild.verify.report import write_report

        write_report(tmp, report_data)
        write_text_atomic(tmp / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True))
        write_text_atomic(tmp / OWNER_MARKER, MARKER_TEXT)
        replace_path(tmp, out)
        return True
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _delivered(source: Path, target: Path) -> bool:
    """Whether ``target`` holds exactly the (just verified) store files under ``source``: the
    same inodes, or files of the same digest. A store entry rebuilt after corruption has new
    files, so an output still linked to the corrupt ones is rewritten."""
    pairs = [(source, target)] if source.is_file() else [
        (p, target / p.relative_to(source)) for p in source.rglob("*") if p.is_file()]
    if not source.is_file():
        made = {p.relative_to(target) for p in target.rglob("*") if p.is_file()}
        if made != {t.relative_to(target) for _, t in pairs}:
            return False
    try:
        return all(t.is_file() and not t.is_symlink() and (
            os.path.samefile(s, t) or hashstate.file_sha256(t) == hashstate.file_sha256(s)) for s, t in pairs)
    except OSError:
        return False


def _link_or_copy(src, dst) -> None:
    """Hard-link a store file into the output directory (no copy of gigabytes of weights) once it
    is read-only, so that editing the output in place cannot reach the store; if it cannot be made
    read-only, or across file systems, reflink where the file system can, else copy."""
    if seal(src):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    _clone_or_copy(src, dst)


FICLONE = 0x40049409  # Linux ioctl: share the extents of another file (btrfs, XFS, ...)


def _clone_or_copy(src, dst) -> None:
    try:
        import fcntl

        with open(src, "rb") as source, open(dst, "wb") as target:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        shutil.copystat(src, dst)
        return
    except (ImportError, OSError):
        pass
    shutil.copy2(src, dst)


def local_inputs(build: Build) -> list[Path]:
    """``planned_inputs`` with the source the resolver found (a download is not a local input)."""
    resolved = build.job.results.get("resolve")
    downloaded = build.variant.recipe.source.model.split(":")[0] in ("pypi", "https")
    return planned_inputs(build, resolved.path if resolved is not None and not downloaded else None)


def write_depfile(path: Path, builds: list[Build]) -> str:
    """Make-format dependencies: each variant's output dir depends on its local inputs. Returns the text."""
    lines = []
    for build in builds:
        escape = lambda p: str(os.path.relpath(p)).replace(" ", "\\ ")
        lines.append(f"{escape(build.output_dir)}: " + " \\\n  ".join(escape(p) for p in local_inputs(build)))
    text = "\n".join(lines) + "\n"
    write_text_atomic(path, text)
    return text
