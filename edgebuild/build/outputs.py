"""Output directories: edgebuild replaces only what it made, in one rename, never through a symlink."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from edgebuild.build.lockfile import lock_data
from edgebuild.store.lockfile import LOCK_NAME, read_lock
from edgebuild.errors import UsageError
from edgebuild.recipe import Variant
from edgebuild.store import hashstate
from edgebuild.store.atomic import (
    make_temp_dir,
    publish_tree,
    replace_path,
    write_text_atomic,
)
from edgebuild.store.links import link_or_copy

if TYPE_CHECKING:
    from edgebuild.build.jobs import Build


OWNER_MARKER = ".edgebuild-output"  # in every output directory edgebuild made; only those it replaces


MARKER_TEXT = ("This directory was written by edgebuild, which replaces it on every build.\n"
               "Delete this file to keep edgebuild from ever replacing it.\n")


REPORT_FILES = ("report.json", "report.html")

# Written last into a variant's directory, only when the variant built and passed validation,
# and refreshed when a later run finds it up to date: the target Make rules name (--depfile),
# so a failed build is never taken for a done one, and a touched but unchanged input is
# rebuilt once, not on every make.
BUILT_STAMP = ".edgebuild-built"
BUILT_TEXT = "edgebuild wrote this file last, after the variant built and passed validation.\n"


def output_location(variant: Variant) -> tuple[Path, Path]:
    """(outputs.dir, <outputs.dir>/<variant>). outputs.dir may sit behind a symlink (a build
    volume), so it is resolved; the variant directory is not: it is what gets replaced, and a
    symlink there is refused rather than followed."""
    root = (variant.base_dir / (variant.recipe.outputs.dir or f"build/{variant.recipe.name}")).resolve()
    return root, Path(os.path.normpath(root / variant.name))


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
    return names <= {LOCK_NAME, BUILT_STAMP, *REPORT_FILES, *Path(artifact).parts[:1]}


def settle_artifact(build: Build) -> None:
    """The artifact stage may report what it actually made (``info["artifact"]``): a bundle
    whose model Core ML runs whole is a plain ``model.mlpackage``."""
    for stage in reversed(build.job.stages):
        if stage.extra.get("artifact") and stage.name in build.job.results:
            build.artifact = build.job.results[stage.name].info.get("artifact", build.artifact)
            return


def artifact_result(build: Build):
    """The stage result the artifact is taken from: the last stage declaring one, else the last stage."""
    final = build.job.stages[-1].name
    for stage in reversed(build.job.stages):
        if stage.extra.get("artifact"):
            final = stage.name
            break
    return build.job.results[final]


def artifact_source(build: Build) -> Path | None:
    """The artifact's file or directory in the store (what the output directory links)."""
    return artifact_result(build).path / build.artifact if build.artifact else None


def artifact_links(build: Build) -> dict[str, tuple[Path, str]] | None:
    """``{path in the output directory: (store file, sha256 from its entry's manifest)}`` for
    every file of the artifact as ``materialise`` links it; None if the manifest does not name
    them all (an entry of no manifest: a --no-cache run's temporaries)."""
    source = artifact_source(build)
    if source is None:
        return {}
    result = artifact_result(build)
    try:
        manifest = json.loads((result.path.parent / "meta.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    links = {}
    for path in files:
        entry = manifest.get(path.relative_to(result.path).as_posix()) if isinstance(manifest, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            return None
        links[(Path(build.artifact) / path.relative_to(source)).as_posix()] = (path, entry["sha256"])
    return links


def materialise(build: Build, registry, report_data: dict) -> bool:
    """Write the variant's output directory in one rename: artifact, reports, lock file, marker.

    Returns False when the directory was already up to date and left alone."""
    out = build.output_dir
    check_output_dir(build)  # again: the directory may have changed since planning
    lock = lock_data(build, registry)
    source = artifact_source(build)
    previous = read_lock(out)
    # (edgebuild.report.write's names; not imported: it loads numpy, which a cached run need not)
    complete = all((out / name).exists() for name in (build.artifact, "report.json", "report.html"))
    passed = _passed(report_data)
    if (previous is not None and previous.get("stages") == lock["stages"] and complete
            and (source is None or _delivered(source, out / build.artifact))):
        _stamp_built(out, passed)  # nothing else changed: the directory is left alone
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, f".{out.name}.", ".tmp")
    try:
        if source is not None and source.exists():
            if source.is_dir():
                shutil.copytree(source, tmp / build.artifact, copy_function=link_or_copy)
            else:
                link_or_copy(source, tmp / build.artifact)
        publish_tree(tmp)
        from edgebuild.report.write import write_report

        write_report(tmp, report_data)
        write_text_atomic(tmp / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True))
        write_text_atomic(tmp / OWNER_MARKER, MARKER_TEXT)
        if passed:
            write_text_atomic(tmp / BUILT_STAMP, BUILT_TEXT)
        replace_path(tmp, out)
        return True
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _passed(report_data) -> bool:
    status = report_data.get("status") if isinstance(report_data, dict) else getattr(report_data, "status", None)
    return status == "built"


def _stamp_built(out: Path, passed: bool) -> None:
    """An up-to-date directory keeps its stamp only while the variant passes; one written by an
    edgebuild before the stamp (marker present) gets it."""
    stamp = out / BUILT_STAMP
    if not passed:
        stamp.unlink(missing_ok=True)
    elif not stamp.exists() and (out / OWNER_MARKER).is_file():
        write_text_atomic(stamp, BUILT_TEXT)


def refresh_built(build: Build, inputs: list[Path]) -> None:
    """Give an up-to-date variant's stamp a fresh time when an input is newer (touched, content
    unchanged), so Make sees the target newer than its prerequisites and stops rebuilding it."""
    stamp = build.output_dir / BUILT_STAMP
    try:
        made = stamp.stat().st_mtime_ns
    except OSError:
        return
    newest = max((p.stat().st_mtime_ns for p in map(Path, inputs) if p.exists()), default=0)
    if newest >= made and stamp.is_file() and not stamp.is_symlink():
        os.utime(stamp)


def withdraw_built(build: Build) -> None:
    """A variant whose build failed has no stamp (Make's .DELETE_ON_ERROR): the next make runs it again."""
    out = build.output_dir
    stamp = out / BUILT_STAMP
    if out.is_dir() and not out.is_symlink() and (out / OWNER_MARKER).is_file() and stamp.is_file():
        stamp.unlink(missing_ok=True)


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
