"""Make-format dependency files (``--depfile``): each variant's build stamp depends on its local inputs.

The target of each rule is the variant's ``BUILT_STAMP``, which exists only after the variant
built and passed validation, so Make never takes a failed build for a done one. Every path is
written the way GNU Make reads it back as one word (``$`` doubled; ``#``, space, ``:`` and
glob characters backslash-escaped); a path Make has no spelling for (a newline, ``;``, ``=``,
``|``, a backslash, ...) is refused with its name, rather than written as something Make would
run or split. The file starts with ``HEADER``: edgebuild replaces only files that do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from edgebuild.build.jobs import local_inputs, planned_inputs
from edgebuild.build.outputs import BUILT_STAMP
from edgebuild.errors import UsageError
from edgebuild.store.atomic import write_text_atomic

if TYPE_CHECKING:
    from edgebuild.build.jobs import Build

HEADER = "# edgebuild depfile: written by `edgebuild run --depfile`, which replaces only files that start with this line"

_ESCAPED = {"$": "$$", "#": "\\#", " ": "\\ ", ":": "\\:"}
_GLOB = {"*": "\\*", "?": "\\?", "[": "\\["}  # GNU Make unescapes these in prerequisites, not in targets
# no spelling Make reads back as one word: a line break or control character, a recipe or
# variable separator, an order-only bar, a backslash (it would escape what follows)
_UNSPELLABLE = re.compile(r"[\x00-\x1f\x7f;=|\\]")
_TARGET_ONLY = re.compile(r"[%*?\[]")  # in a target: a pattern rule, or a glob Make does not unescape
_ARCHIVE = re.compile(r"\(.*\)$")  # lib(member) is an archive member to Make


def make_word(path: str, *, target: bool = False) -> str:
    """``path`` as one word of a Make rule (a target, or a prerequisite); UsageError if Make cannot spell it."""
    bad = _UNSPELLABLE.search(path) or (_TARGET_ONLY.search(path) if target else None) or _ARCHIVE.search(path)
    if bad is not None or not path:
        what = f"the character {bad.group(0)[0]!r}" if bad is not None else "an empty name"
        raise UsageError(f"--depfile: Make cannot name {path!r} as a {'target' if target else 'prerequisite'} "
                         f"(it holds {what})",
                         hint="rename that file or folder, or leave out --depfile")
    if path.startswith("~"):  # Make expands ~ and ~user at the start of a word
        path = "./" + path
    table = _ESCAPED if target else {**_ESCAPED, **_GLOB}
    return "".join(table.get(ch, ch) for ch in path)


def target_of(build: Build) -> Path:
    """The file a Makefile names as the variant's target (see outputs.BUILT_STAMP)."""
    return build.output_dir / BUILT_STAMP


def is_depfile(path: Path) -> bool:
    """Whether ``path`` is a depfile edgebuild wrote (and may replace): it starts with ``HEADER``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.readline().rstrip("\n") == HEADER
    except OSError:
        return False


def check_depfile(path: Path, builds: list[Build]) -> None:
    """Before any build work: ``path`` may be written (a new file, or a depfile edgebuild wrote),
    lies outside every variant's output directory (those are replaced whole), and every planned
    target and prerequisite has a Make spelling."""
    if path.exists() and not is_depfile(path):
        raise UsageError(f"--depfile {path}: the file exists and is not an edgebuild depfile "
                         f"(its first line is not {HEADER!r}); it would be replaced",
                         hint="remove it (after saving what you need), or give another path, e.g. build/deps.d")
    for build in builds:
        out = build.output_dir.resolve()
        if out in path.resolve().parents:
            raise UsageError(f"--depfile {path}: inside {_relative(out)}, which edgebuild replaces on every build",
                             hint="write it beside the variants, e.g. " + _relative(out.parent / f"{out.name}.d"))
        _rule(target_of(build), planned_inputs(build))


def write_depfile(path: Path, builds: list[Build]) -> str:
    """Write the Make rules for ``builds`` to ``path`` (its folder made if missing). Returns the text."""
    rules = [_rule(target_of(build), local_inputs(build)) for build in builds]
    text = "\n".join([HEADER, *rules]) + "\n"
    if path.exists() and not is_depfile(path):  # appeared during the build
        check_depfile(path, [])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    return text


def _rule(target: Path, prerequisites: list[Path]) -> str:
    words = [make_word(_relative(p)) for p in dict.fromkeys(prerequisites)]
    return f"{make_word(_relative(target), target=True)}:" + "".join(f" \\\n  {w}" for w in words)


def _relative(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
