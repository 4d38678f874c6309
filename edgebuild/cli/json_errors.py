"""The one JSON object a ``--json`` command prints on stdout when it fails before its own output.

``edgebuild run bad.yaml --json`` must still give a CI script exactly one object to parse:

    {"error": {"kind": "recipe", "file": "bad.yaml", "line": 6, "column": 40,
               "message": "bad.yaml:6:40 target.precision: ...", "hint": null}, "version": "0.1.0"}

``kind`` is ``usage`` (the command line), ``recipe``, ``build``, ``plugin``, ``validation``,
``interrupted`` or ``internal``; ``file``, ``line`` and ``column`` are null where they do not
apply. The human message still goes to stderr and the exit code is unchanged.
"""

from __future__ import annotations

import json
import re
import sys

# A RecipeError's message starts with file:line:column (edgebuild.recipe.locations.Location);
# a recipe that cannot be read at all, or is not there, is named alone: "bad.yaml: no such recipe file".
_LOCATED = re.compile(r"(?P<file>[^\n]+?):(?P<line>\d+):(?P<column>\d+)(?=\s|$)")
_FILE_ONLY = re.compile(r"(?P<file>[^\s:-][^\s:]*\.(?:ya?ml|json)):\s")


def wants_json(argv: list[str]) -> bool:
    """``--json`` among the options (not after ``--``, where it would be an argument)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def location(exc) -> tuple[str | None, int | None, int | None]:
    """(file, line, column) an error is about, as far as it tells."""
    message = getattr(exc, "message", None)
    message = message if isinstance(message, str) else ""
    found = _LOCATED.match(message) if getattr(exc, "error_kind", None) == "recipe" else None
    if found:
        return found["file"], int(found["line"]), int(found["column"])
    if getattr(exc, "file", None):
        return exc.file, None, None
    found = _FILE_ONLY.match(message)
    return (found["file"] if found else None), None, None


def error_fields(exc) -> dict:
    """The ``error`` member for ``exc``: an EdgebuildError, a click usage error or anything else."""
    file, line, column = location(exc)
    if _is_click_error(exc):
        ctx = getattr(exc, "ctx", None)
        hint = f"see `{ctx.command_path} --help`" if ctx is not None else None
        return {"kind": "usage" if exc.exit_code == 2 else "build", "file": None, "line": None,
                "column": None, "message": exc.format_message(), "hint": hint}
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "Abort":
        return {"kind": "interrupted", "file": None, "line": None, "column": None,
                "message": "interrupted: nothing half-written was kept", "hint": "run again to continue"}
    kind = getattr(exc, "error_kind", None)
    if kind is None:  # not one of edgebuild's errors: a bug, reported as such
        return {"kind": "internal", "file": None, "line": None, "column": None,
                "message": f"{type(exc).__name__}: {exc}", "hint": "rerun with --debug for the traceback"}
    return {"kind": kind, "file": file, "line": line, "column": column, "message": exc.message, "hint": exc.hint}


def _is_click_error(exc) -> bool:
    # by shape: typer releases differ in whether click's exceptions are click's or a vendored copy
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def error_object(exc) -> dict:
    from edgebuild.versions import edgebuild_version

    return {"error": error_fields(exc), "version": edgebuild_version()}


def print_error_object(exc) -> None:
    sys.stdout.write(json.dumps(error_object(exc)) + "\n")
    sys.stdout.flush()


class WatchedStdout:
    """sys.stdout, remembering whether anything was written: a command that printed its own
    object before failing (a run whose last step broke) gets no second one."""

    def __init__(self, stream):
        self._stream = stream
        self.written = False

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def error_printer(argv: list[str]):
    """What ``main`` calls with a failure: prints its object when ``--json`` is on the command
    line and stdout is still empty; does nothing otherwise."""
    if not wants_json(argv):
        return lambda exc: None
    watched = sys.stdout = WatchedStdout(sys.stdout)

    def failed(exc) -> None:
        if not watched.written:
            print_error_object(exc)

    return failed
