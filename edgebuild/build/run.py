"""``edgebuild run``: drive the executor over every variant's job, materialise the outputs, tell the display."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from edgebuild.build.depfile import check_depfile, write_depfile
from edgebuild.build.jobs import Build, load_variants, local_inputs, plan_jobs
from edgebuild.build.lockfile import stage_renamings
from edgebuild.build.outputs import artifact_links, materialise, refresh_built, settle_artifact, withdraw_built
from edgebuild.build.summary import plain_lines, print_summary, rows
from edgebuild.dag.executor import Executor
from edgebuild.errors import UsageError, ValidationFailed
from edgebuild.report.console import (as_printer, detail_lines, escape, renaming_lines, result_line, stage_line,
                                      unprinted_warnings)
from edgebuild.report.html import human_bytes
from edgebuild.report.verdict import compared
from edgebuild.report.write import INDEX_HTML, REPORT_HTML, REPORT_JSON, check_page
from edgebuild.store.location import open_store


def _validation_failures(build: Build) -> list[dict]:
    """Every runtime's unmet limits as ``{"output", "runtime", "metric", "value", "limit", ...}``.

    Read from the runtimes' records, which have always been structured (a validate stage
    cached by an older edgebuild kept its top-level failures as sentences)."""
    result = build.job.results.get("validate")
    runtimes = (result.info.get("runtimes") or {}) if result is not None else {}
    return [{"output": f.get("output"), "runtime": runtime, "metric": f.get("metric"), "value": f.get("value"),
             "limit": f.get("limit"), "statistic": f.get("statistic", "worst"), "message": f.get("message", ""),
             **{k: f[k] for k in ("prompt", "step") if k in f}}  # generation validation: where it failed
            for runtime, record in runtimes.items() for f in record.get("failures") or []]


def _status(build: Build) -> str:
    """"failed" when a stage failed or validation missed a limit; else "built"."""
    return "failed" if build.job.error is not None or _validation_failures(build) else "built"


def _validation(build: Build) -> dict:
    result = build.job.results.get("validate")
    return {**result.info, "failures": _validation_failures(build)} if result is not None else {}


def _artifact_path(build: Build) -> Path | None:
    return build.output_dir / build.artifact if build.artifact and build.job.error is None else None


def _comparison(build: Build) -> Path:
    return build.output_dir.parent / INDEX_HTML


def _done_line(build: Build, *, replay: bool = False) -> str:
    """The variant's last word (report.console.result_line); ``replay``: as an up-to-date repeat prints it."""
    made = _artifact_path(build)
    validate = build.job.results.get("validate")
    return result_line(build.job.label, failures=len(_validation_failures(build)),
                       validated=validate is not None and compared(validate.info.get("runtimes") or {}),
                       where=escape(_relative(made if made is not None else build.output_dir)),
                       size=human_bytes(_size(build, build.job.results)),
                       report=escape(_relative(build.output_dir / REPORT_HTML)),
                       warnings=unprinted_warnings(build.job.results.values(), replay=replay))


def _variant_json(build: Build, *, as_cached: bool = False) -> dict:
    """The variant's ``run --json`` object; ``as_cached``: as a repeat of the run would report it."""
    job = build.job
    artifact = _artifact_path(build)
    reported = job.error is None and (build.output_dir / REPORT_JSON).exists()
    comparison = _comparison(build)
    return {
        "recipe": build.variant.recipe.name,
        "variant": build.variant.name,
        "status": _status(build),
        "artifacts": [str(artifact)] if artifact is not None else [],
        "artifact_sizes": {str(artifact): _size(build, job.results)} if artifact is not None else {},
        "output_dir": str(build.output_dir),
        "report": str(build.output_dir / REPORT_HTML) if reported else None,
        "report_json": str(build.output_dir / REPORT_JSON) if reported else None,
        **({"comparison": str(comparison)} if reported and comparison.exists() else {}),
        "stages": [{"name": r.name, "key": r.key, "status": "cached" if as_cached else r.status,
                    "seconds": 0.0 if as_cached else r.seconds}
                   for r in job.results.values()],
        "validation": _validation(build),
        **({"error": str(job.error)} if job.error is not None else {}),
    }


def _run_json(builds: list[Build], *, as_cached: bool = False) -> str:
    from edgebuild.versions import edgebuild_version

    variants = [_variant_json(b, as_cached=as_cached) for b in builds]
    return json.dumps({"variants": variants, "version": edgebuild_version()}) + "\n"


def _report_data(build: Build, registry):
    """The variant's report (report_schema.Report): header, stages, each stage's record, and the
    sections the page draws lifted from the stages that measure them."""
    from edgebuild.dag.stages import versions
    from edgebuild.versions import edgebuild_version
    from edgebuild.report.schema import Report

    recipe = build.variant.recipe
    results = build.job.results
    data = {
        "recipe": recipe.name, "variant": build.variant.name, "status": _status(build),
        "edgebuild_version": edgebuild_version(),
        "recipe_path": os.path.relpath(build.variant.path, build.output_dir),
        "source": {"model": recipe.source.model,
                   "sha256": results["resolve"].info["sha256"] if "resolve" in results else None},
        "target": {"backend": recipe.target.backend, "deployment_target": recipe.target.deployment_target,
                   "precision": recipe.target.precision},
        "compute": {"policy": recipe.compute.policy, "chip": recipe.compute.chip},
        "versions": versions(registry),
        "artifact": {"path": build.artifact, "kind": Path(build.artifact).suffix.lstrip(".") or "bundle",
                     "size_bytes": _size(build, results)},
        "comparison": f"../{INDEX_HTML}",
        "stages": [{"name": r.name, "status": r.status, "seconds": r.seconds, "key": r.key} for r in results.values()],
    }
    notes = []
    for name, result in results.items():
        if name != "resolve":
            data[name] = result.info
        notes += [str(n) for n in result.info.get("notes") or []] if isinstance(result.info.get("notes"), list) else []
    if "validate" in results:
        data["validation"] = _validation(build)
    if "weights" in (results["compress"].info if "compress" in results else {}):
        data["compression"] = results["compress"].info
    for name in ("lower", "compress", "package"):  # the last stage that planned the program
        if name in results and "plan" in results[name].info:
            data["plan"] = results[name].info["plan"]
    data["renamings"] = stage_renamings(results)
    if notes:
        data["notes"] = notes
    return Report.model_validate(data)


def _size(build: Build, results) -> int:
    final = next((r for r in reversed(list(results.values())) if (r.path / build.artifact).exists()), None) \
        if build.artifact else None
    if final is None:
        return 0
    path = final.path / build.artifact
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_recipes(recipes, *, variants=None, jobs=1, cache_dir=None, no_cache=False, force=False,
                as_json=False, depfile=None, verbose=False, console, remote=None, matrix=None, report_file=None,
                executor="local", planned: list | None = None) -> int:
    """``planned``: a list the planned builds are appended to (``edgebuild watch`` reads their inputs);
    ``remote``: the run's remote cache settings (edgebuild.store.config.RemoteSettings) or None;
    ``matrix``: axes from ``--matrix`` (``{"chips": ["m1", "m3"]}``); ``report_file``: where to
    write the page comparing every variant of the command (default: see ``_write_combined``); ``executor``: ``local`` or ``dask://HOST:PORT``."""
    from edgebuild.registry import get_registry
    from edgebuild.store.remote_policy import open_remote

    display = as_printer(console, verbose=verbose)
    registry = get_registry()
    store = open_store(cache_dir)
    builds = plan_jobs(load_variants(recipes, variants, registry, matrix=matrix), registry, store)
    if planned is not None:
        planned += builds
    if report_file is not None:
        check_report_file(Path(report_file), builds)
    if depfile:
        check_depfile(Path(depfile), builds)
    for page in sorted({_comparison(b) for b in builds}):  # before any build work, not after it
        check_page(page)
    shared = open_remote(None if no_cache else store, remote,
                         warn=lambda text: display.print(f"[yellow]warning[/] {escape(text)}"))
    # --no-cache: stage outputs are temporaries in one folder, removed once the outputs are written
    scratch = Path(tempfile.mkdtemp(prefix="edgebuild-run-")) if no_cache else None
    try:
        executor = _executor(executor, builds, store, scratch=scratch, jobs=jobs, force=force,
                             on_event=display.on_event, remote=shared, remote_settings=remote)
        try:
            executor.run([b.job for b in builds])
        finally:
            display.close()
        code = 0
        for build in builds:
            if build.job.error is not None:
                display.error(f"[red]error[/] {build.job.label}: {escape(build.job.error)}")
                code = max(code, build.job.error.exit_code)
                withdraw_built(build)
                continue
            settle_artifact(build)
            build.written = materialise(build, registry, _report_data(build, registry))
            refresh_built(build, local_inputs(build))
            failures = _validation_failures(build)
            for failure in failures:
                display.error(f"[red]threshold[/] {build.job.label}: {failure['runtime']}: {escape(failure['message'])}")
            if failures:
                code = max(code, ValidationFailed.exit_code) if code != 1 else code
        comparisons = _write_comparisons(builds, display)
        combined = _write_combined(builds, report_file, comparisons, display)
        for build in builds:
            if build.job.error is None:
                display.print(_done_line(build))
        if len(builds) > 1:
            print_summary(display, [_variant_json(b) for b in builds])
        # where to look comes last
        for page in comparisons:
            display.print(f"comparison of the variants: {escape(_relative(page))}")
        if combined is not None:
            display.print(f"combined report: {escape(_relative(combined))}")
        dependencies = write_depfile(Path(depfile), builds) if depfile else None
        if as_json:
            sys.stdout.write(_run_json(builds))
        if code == 0 and not no_cache:
            _stamp(builds, as_json, (Path(depfile), dependencies) if depfile else None, quiet=display.quiet,
                   combined=combined)
        return code
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _executor(spec: str, builds: list[Build], store, *, scratch: Path | None, jobs: int, force: bool, on_event,
              remote=None, remote_settings=None):
    """``--executor``: local threads (``-j N``), or the stage graph on a Dask cluster (``dask://HOST:PORT``),
    whose workers open the remote cache from its settings themselves. ``scratch``: --no-cache's folder
    of temporaries (no store)."""
    if spec == "local":
        return Executor(None if scratch else store, jobs=jobs, force=force, on_event=on_event, scratch=scratch,
                        remote=remote)
    from edgebuild.dag.dask_executor import DaskExecutor, scheduler_address

    address = scheduler_address(spec)
    if scratch is not None:
        raise UsageError("--no-cache with --executor dask://: the workers hand their results over through the store",
                         hint="leave out --no-cache (or use --executor local)")
    return DaskExecutor(address, store, variants={b.job.label: b.variant for b in builds}, force=force,
                        on_event=on_event, remote=remote_settings)


def _stamp(builds: list[Build], as_json: bool, depfile, *, quiet: bool = False, combined: Path | None = None) -> None:
    """Let an identical repeat of this successful run answer without building (edgebuild.build.uptodate)."""
    from edgebuild.build import uptodate

    files, touch, lines, outputs = [], [], [], []
    for build in builds:
        files += local_inputs(build)
        links = artifact_links(build)  # None: a variant that cannot be restored, so none is (all or nothing)
        outputs = None if outputs is None or links is None else [*outputs, (build.output_dir, links)]
        for result in build.job.results.values():
            lines.append(stage_line(build.job.label, result.name, "cached", 0.0))
            lines += detail_lines(result, fresh=False)  # printed when the stage ran; counted on the done line
            lines += renaming_lines(build.job.label, result)
            if result.name == "resolve":
                files.append(result.path)
                continue
            files += [result.path, *result.path.rglob("*")]  # the store entry's files
            touch.append(result.path.parent / "meta.json")
        files += [build.output_dir, *build.output_dir.rglob("*")]
    lines += [_done_line(build, replay=True) for build in builds]
    lines += [f"comparison of the variants: {escape(_relative(p))}" for p in sorted({_comparison(b) for b in builds})
              if p.exists()]
    if combined is not None:
        files.append(combined)
        lines.append(f"combined report: {escape(_relative(combined))}")
    if len(builds) > 1:
        lines += [escape(line) for line in plain_lines(rows([_variant_json(b, as_cached=True) for b in builds]))]
    stdout = _run_json(builds, as_cached=True) if as_json else ""
    uptodate.record(files=files, touch=touch, stderr=[] if quiet else lines, stdout=stdout, depfile=depfile,
                    outputs=outputs)


def _write_comparisons(builds: list[Build], display) -> list[Path]:
    """The page comparing a recipe's variants (size, error, status), beside their folders; a
    stale report of a variant this run did not build is left off, with a warning."""
    from edgebuild.report.write import write_combined

    def skipped(path: Path, why: str) -> None:
        display.print(f"[yellow]warning[/] comparison page leaves out {escape(_relative(path))}: {escape(why)}")

    roots = sorted({build.output_dir.parent for build in builds if build.job.error is None})
    return [write_combined(root, on_skip=skipped) for root in roots]


def check_report_file(page: Path, builds: list[Build]) -> None:
    """``--report FILE``: a file edgebuild may write (a new one, or a page it wrote), outside
    every variant's output directory (those are replaced whole)."""
    from edgebuild.errors import UsageError
    from edgebuild.report.write import made_by_edgebuild

    if page.is_dir():
        raise UsageError(f"--report {page}: is a directory; give the path of an .html file to write",
                         hint=f"e.g. --report {page / INDEX_HTML}")
    if not page.parent.is_dir():
        raise UsageError(f"--report {page}: the directory {page.parent} does not exist")
    if page.exists() and not made_by_edgebuild(page):
        raise UsageError(f"--report {page}: the file exists and edgebuild did not write it; it would be replaced",
                         hint="remove it (after saving what you need), or give another path")
    for build in builds:
        out = build.output_dir.resolve()
        if out in page.resolve().parents:
            raise UsageError(f"--report {page}: inside {_relative(out)}, which edgebuild replaces on every build",
                             hint="write it beside the variants, e.g. in outputs.dir")


def _write_combined(builds: list[Build], report_file, comparisons: list[Path], display) -> Path | None:
    """The page comparing every variant this command built: ``report_file`` if given; else, when
    the variants sit under several output roots, ``index.html`` in the folder they share (one
    root's own comparison page already is the command's page). An HTML file edgebuild did not
    write is never replaced."""
    import os

    from edgebuild.report.write import made_by_edgebuild, write_combined_page

    built = [b.output_dir for b in builds if b.job.error is None and (b.output_dir / REPORT_JSON).exists()]
    if not built:
        return None
    if report_file is not None:
        page = Path(report_file)
    else:
        roots = sorted({d.parent for d in built})
        if len(roots) < 2:
            return None
        common = Path(os.path.commonpath(roots))
        page = common / INDEX_HTML
        if common.parent == common or (page.exists() and not made_by_edgebuild(page)) or page in comparisons:
            display.print(f"[yellow]warning[/] no combined report for the {len(built)} variants: "
                          f"{escape(_relative(page))} is another page (not edgebuild's, or a recipe's comparison); "
                          "give --report FILE")
            return None

    def skipped(path: Path, why: str) -> None:
        display.print(f"[yellow]warning[/] combined report leaves out {escape(_relative(path))}: {escape(why)}")

    return write_combined_page(page, built, on_skip=skipped)


def _relative(path: Path) -> str:
    import os

    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


