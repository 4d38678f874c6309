"""Errors a user sees. Each carries the exit code the CLI returns for it."""

from __future__ import annotations


class EdgebuildError(Exception):
    """A failure with a message meant for a person; never shown as a traceback."""

    exit_code = 1
    error_kind = "build"  # the "kind" of the CLI's JSON error object (edgebuild.cli.json_errors)

    def __init__(self, message: str, *, hint: str | None = None, file: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.file = file  # the file the error is about, when the message does not start with file:line

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(EdgebuildError):
    """Bad command line or bad recipe (exit 2)."""

    exit_code = 2
    error_kind = "usage"


class RecipeError(UsageError):
    """A recipe that does not validate; the message starts with file:line:column.

    A plugin checking a recipe (which has no locations) raises it with ``path``, the dotted
    path of the offending value as a tuple, and the core puts the file:line:column in front.
    """

    error_kind = "recipe"

    def __init__(self, message: str, *, hint: str | None = None, path: tuple | None = None, file: str | None = None):
        super().__init__(message, hint=hint, file=file)
        self.path = path


class BuildError(EdgebuildError):
    """A stage failed (exit 1)."""

    exit_code = 1


class NotRepresentable(BuildError):
    """The model asks for something the target format cannot express by design (a random
    mask drawn from numpy's generator, say), as opposed to a lowering that is missing or wrong."""


class PluginError(BuildError):
    """A plugin failed to load or clashes with another."""

    error_kind = "plugin"


class ValidationFailed(EdgebuildError):
    """The artifact was built but misses the recipe's numeric thresholds (exit 3)."""

    exit_code = 3
    error_kind = "validation"
