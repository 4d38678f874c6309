"""The no-op fast path: answer a repeated ``edgebuild run`` without loading the build machinery.

A successful run records a stamp in the store: the stat signature (inode, size, mtime, ctime)
of everything its result depends on — the recipe files and the recipes they extend, the source
model, validation inputs, every store entry the build used, the output directories — and of
every import directory (installing, upgrading or removing a plugin changes one) and of the
sources of working copies (:mod:`edgebuild.versions`), plus what the run printed. When the
same command runs again in the same place and environment and every signature still matches,
nothing could build differently: the stamp's output is printed and the run ends, at the cost of
a few hundred ``stat`` calls instead of importing pydantic, the plugins and the recipe loader.
When the only difference is that output directories were deleted, they are written back from
the stamp's description of them (:mod:`edgebuild.build.restore`) before the output is printed.
Any other difference, or any doubt, falls through to the full run.

This module must stay on the standard library: it runs before anything else is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

VERSION = 1
NEVER_REPLAYED = ("--force", "--no-cache", "-v", "--verbose", "--help")

entry_argv: list[str] | None = None  # set by the console entry point; only such runs are stamped


def _signature(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    if os.path.isdir(path):
        return [st.st_ino, st.st_mtime_ns]
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _cache_root(argv: list[str]) -> Path:
    for i, arg in enumerate(argv):
        if arg == "--cache-dir" and i + 1 < len(argv):
            return Path(argv[i + 1]).expanduser().resolve()
        if arg.startswith("--cache-dir="):
            return Path(arg.split("=", 1)[1]).expanduser().resolve()
    if os.environ.get("EDGEBUILD_CACHE_DIR"):
        return Path(os.environ["EDGEBUILD_CACHE_DIR"]).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgebuild"))


def _stamp_path(argv: list[str]) -> Path:
    """One stamp per command line, working directory, interpreter and relevant environment."""
    from edgebuild._version import __version__

    context = {
        "argv": argv, "cwd": os.getcwd(), "python": sys.executable, "path": sys.path, "edgebuild": __version__,
        "env": {k: v for k, v in os.environ.items() if k.startswith("EDGEBUILD_") or k == "PYTHONPATH"},
    }
    key = hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()
    return _cache_root(argv) / "stamps" / f"{key[:32]}.json"


def _eligible(argv: list[str]) -> bool:
    args = [a for a in argv if a != "--debug"]
    return bool(args) and args[0] == "run" and not any(a.split("=", 1)[0] in NEVER_REPLAYED for a in args)


def _import_dirs() -> list[str]:
    # The working directory heads sys.path under ``python -m``; recipes and outputs change it
    # all the time and plugins are not imported from it, so it is not watched.
    cwd = os.getcwd()
    return [p for p in sys.path if p and p != cwd and os.path.isdir(p)]


def replay(argv: list[str]) -> int | None:
    """The exit code if the stamp for ``argv`` still holds (its output printed), else None."""
    if not _eligible(argv):
        return None
    try:
        stamp_path = _stamp_path(argv)
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("version") != VERSION:
            return None
        watched = stamp["paths"]
        changed = {path for path, signature in watched.items() if _signature(path) != signature}
        if changed and not stamp.get("restore"):
            return None
        if _import_dirs() != stamp["import_dirs"]:
            return None
        depfile = stamp.get("depfile")
        if depfile is not None:
            target = Path(depfile["path"])
            header = depfile["text"].split("\n", 1)[0]
            if target.exists() and not target.read_text(errors="replace").startswith(header + "\n"):
                return None  # someone else's file now: the full run refuses it, naming it
        blobs = stamp_path.parent / "blobs"
        used = [*stamp.get("touch", ()), stamp_path]
        if stamp.get("restore"):
            from edgebuild.build.restore import blob_names

            used += [blobs / name for name in blob_names(stamp["restore"])]
        _touch(used)  # before a restore links store files: `cache gc` goes by last use
        if changed:
            from edgebuild.build.restore import restore

            rewritten = restore(stamp["restore"], changed, blobs, watched)
            if rewritten is None:
                return None
            # the restored files and the store files they link, as they are now: the next repeat is a no-op
            watched.update({path: _signature(path) for path in rewritten if path in watched})
            _write_if_changed(stamp_path, json.dumps(stamp))
        if depfile is not None:
            _write_if_changed(target, depfile["text"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the full run reports whatever is wrong
    from edgebuild.report.console import Printer

    printer = Printer()
    for line in stamp["stderr"]:
        printer.print(line)
    if stamp["stdout"]:
        sys.stdout.write(stamp["stdout"])
    return 0


def _touch(paths) -> None:
    for path in paths:  # a use, for `cache gc`
        try:
            os.utime(path)
        except OSError:
            pass


def record(*, files: list[Path], touch: list[Path], stderr: list[str], stdout: str = "",
           depfile: tuple[Path, str] | None = None,
           outputs: list[tuple[Path, dict[str, tuple[Path, str]]]] | None = None) -> None:
    """Stamp a successful run started from the console entry point (see ``replay``). ``outputs``:
    its variant directories, each with the store files its artifact links (``{relative path:
    (store file, sha256)}``), so that a repeat finding them deleted writes them back
    (:mod:`edgebuild.build.restore`)."""
    if entry_argv is None or not _eligible(entry_argv):
        return
    from edgebuild.versions import watched_paths

    stamp_path = _stamp_path(entry_argv)
    restore = None
    if outputs:
        from edgebuild.build.restore import describe

        try:
            restore = describe(outputs, stamp_path.parent / "blobs")
        except OSError:
            restore = None  # a repeat finding them gone is a full run, nothing worse
    dirs = _import_dirs()
    paths = {str(Path(p).absolute()): None for p in files}
    paths.update({p: None for p in [*dirs, *watched_paths()]})
    stamp = {
        "version": VERSION,
        "paths": {path: _signature(path) for path in paths},
        "import_dirs": dirs,
        "touch": [str(p) for p in touch],
        "stderr": stderr,
        "stdout": stdout,
        "depfile": {"path": str(depfile[0].absolute()), "text": depfile[1]} if depfile else None,
        "restore": restore,
    }
    try:
        _write_if_changed(stamp_path, json.dumps(stamp))
    except OSError:
        pass  # a read-only or full cache: the next run is a full one, nothing worse


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
