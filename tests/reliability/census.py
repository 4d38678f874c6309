"""The reliability suite's counts, from what its tests did rather than from prose:

    python tests/reliability/census.py [--json] [pytest arguments...]

runs every test file under tests/reliability, each in its own pytest process (as the files run on
their own; a file that does not end within ``FILE_SECONDS`` is stopped and counted as a hang), with
this module loaded as a pytest plugin that records what each case did, and counts:

- inputs tried: test cases run (a parametrized case is one hostile or broken input or race);
- CLI runs: every ``edgebuild`` command the cases ran, in a subprocess or in this process, by
  exit code; "exit 2 with file:line": those that exit 2 naming a recipe, config or JSON file
  with its line;
- tracebacks: CLI runs (without ``--debug``) whose error output holds a Python traceback or
  "internal error";
- hangs: cases that failed on a timeout (a subprocess that did not end, a bounded wait that ran out);
- user files lost: cases after which a file or folder named ``victim*`` that their set-up put in
  their tmp_path is gone or changed; for cases without one, the failed cases of the test files
  that guard a user's files;
- forged or corrupt entries served, builds broken: failed cases of the test files that feed the
  store and the remote damaged or forged entries, or race ``cache gc``/``clear`` and Ctrl-C with a
  build (``FILES_LOST``, ``ENTRIES_SERVED`` and ``BUILDS_BROKEN`` below name the files);
- failed, expected-to-fail (known holes) and skipped cases, overall and per test file.

A case that passes held its property (its assertions say which); a failed one is a hole, and so
is one marked as an expected failure (xfail), which the counts call a known hole.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RECORD_ENV = "EDGEBUILD_CENSUS_RECORD"  # the JSON-lines file a test process appends its records to
FILE_SECONDS = 1200  # a test file still running after this long is stopped: a hang

# The test files that put a user's file beside the command, feed damaged or forged entries, or
# race housekeeping with a build (glob patterns): a failed case of theirs counts as a file lost,
# an entry served or a build broken, an upper bound, since a case may fail before its last check.
FILES_LOST = ("test_outputs.py", "test_owned_outputs.py", "test_generated_files.py", "test_hostile_keys.py",
              "test_hostile_values.py", "test_make*.py", "test_depfile*.py")
ENTRIES_SERVED = ("test_store.py", "test_remote*.py", "test_forged*.py", "test_signed*.py", "test_entry_layout*.py")
BUILDS_BROKEN = ("test_housekeeping.py", "test_interrupt.py")
RECIPES = ("test_recipes.py", "test_recipe_loading.py")  # malformed recipes, as the previous round counted them

# "recipe.yaml:12:5", "edgebuild.toml:3", "lock.json:1:1" (not "127.0.0.1:8786")
FILE_LINE = re.compile(r"[\w.~-]+\.(?:ya?ml|toml|json):\d+")
TRACEBACK = ("Traceback (most recent call last)", "internal error")
TIMEOUTS = ("TimeoutExpired", "timed out", "Timeout")


@dataclass
class Run:
    case: str
    code: int | None
    stderr: str | None  # None: not captured
    debug: bool


@dataclass
class Census:
    """The records of one suite run: each case's outcome, each edgebuild command's exit and error output."""

    runs: list[Run] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # case -> passed | failed | skipped
    timed_out: set[str] = field(default_factory=set)
    watched: dict[str, list[str]] = field(default_factory=dict)  # case -> the victims it lost

    def add(self, record: dict) -> None:
        if record["type"] == "run":
            self.runs.append(Run(record["case"], record["code"], record["stderr"], record["debug"]))
        elif record["type"] == "case":
            if self.outcomes.get(record["case"]) != "failed":  # a teardown error after a pass still fails
                self.outcomes[record["case"]] = record["outcome"]
            if record.get("timed_out"):
                self.timed_out.add(record["case"])
        elif record["type"] == "victims":
            self.watched[record["case"]] = record["lost"]

    # -- counting ------------------------------------------------------------------------------

    def counts(self) -> dict:
        failed = {case for case, outcome in self.outcomes.items() if outcome == "failed"}
        holes = failed | {case for case, outcome in self.outcomes.items() if outcome == "xfailed"}
        # a case that watched victims says for itself; another case of a file guarding files, by failing
        lost = {case for case, victims in self.watched.items() if victims}
        lost |= {case for case in holes if case not in self.watched and _matches(case, FILES_LOST)}
        codes = Counter(run.code for run in self.runs)
        exit2 = [run for run in self.runs if run.code == 2]
        per_file: dict[str, Counter] = {}
        for case, outcome in self.outcomes.items():
            per_file.setdefault(_file(case), Counter())[outcome] += 1
        return {
            "inputs tried": len(self.outcomes),
            "cases passed": sum(1 for o in self.outcomes.values() if o == "passed"),
            "cases failed": len(failed),
            "known holes (expected failures)": len(holes - failed),
            "cases skipped": sum(1 for o in self.outcomes.values() if o == "skipped"),
            "CLI runs": len(self.runs),
            "CLI runs by exit code": {str(code): n for code, n in sorted(codes.items(), key=lambda kv: str(kv[0]))},
            "exit 2": len(exit2),
            "exit 2 with file:line": sum(1 for run in exit2 if run.stderr and FILE_LINE.search(run.stderr)),
            "recipe commands (malformed recipes)": len(recipes := [run for run in self.runs if _matches(run.case, RECIPES)]),
            "recipe commands: exit 0": sum(1 for run in recipes if run.code == 0),
            "recipe commands: exit 2": sum(1 for run in recipes if run.code == 2),
            "recipe commands: exit 2 with file:line": sum(1 for run in recipes if run.code == 2 and run.stderr
                                                          and FILE_LINE.search(run.stderr)),
            "tracebacks": sum(1 for run in self.runs if _traceback(run)),
            "hangs": len(self.timed_out),
            "cases watching victim files": len(self.watched),
            "user files lost": len(lost),
            "forged or corrupt entries served": sum(1 for case in holes if _matches(case, ENTRIES_SERVED)),
            "builds broken by housekeeping or an interrupt": sum(1 for case in holes if _matches(case, BUILDS_BROKEN)),
            "per test file": {name: dict(counter) for name, counter in sorted(per_file.items())},
            "failed cases": sorted(holes),
            "cases that lost files": sorted(lost),
            "exit 2 without file:line": sorted({run.case for run in exit2
                                                if not (run.stderr and FILE_LINE.search(run.stderr))}),
            "traceback cases": sorted({run.case for run in self.runs if _traceback(run)}),
            "hang cases": sorted(self.timed_out),
        }


class Recorder:
    """The pytest plugin (in each test process): appends a JSON line per case outcome and per
    edgebuild command run to ``$EDGEBUILD_CENSUS_RECORD``."""

    def __init__(self, path: str):
        self.path = path
        self.current = ""

    def _write(self, **record) -> None:
        with open(self.path, "a") as out:
            out.write(json.dumps(record) + "\n")

    def install(self) -> None:
        """Record from now on; called before collection, so test modules that import main get the recording one."""
        self._patch_popen()
        self._patch_main()

    def _record(self, code, stderr, args) -> None:
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
        self._write(type="run", case=self.current, code=code, stderr=stderr, debug="--debug" in [str(a) for a in args])

    def _patch_popen(self) -> None:
        census, communicate = self, subprocess.Popen.communicate

        def recording(popen, *args, **kwargs):
            out, err = communicate(popen, *args, **kwargs)
            if _is_edgebuild(popen.args) and not getattr(popen, "_census_seen", False):
                popen._census_seen = True
                census._record(popen.returncode, err, _argv(popen.args))
            return out, err

        subprocess.Popen.communicate = recording

    def _patch_main(self) -> None:
        import edgebuild.cli.app as app

        census, main = self, app.main

        def recording_main(*args, **kwargs):
            tee = _Tee(sys.stderr)
            sys.stderr = tee
            code = 0
            try:
                main(*args, **kwargs)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
                raise
            finally:
                sys.stderr = tee.inner
                census._record(code, tee.copy.getvalue(), sys.argv)

        app.main = recording_main

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        yield
        self.current = ""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        """Files and folders named ``victim*`` that the case's set-up put in its tmp_path must come
        out of the case as they went in."""
        root = getattr(item, "funcargs", {}).get("tmp_path")
        before = _victims(root)
        yield
        if before:
            after = _victims(root)
            self._write(type="victims", case=item.nodeid, watched=len(before),
                        lost=sorted(path for path, digest in before.items() if after.get(path) != digest))

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            self._write(type="case", case=report.nodeid, outcome=outcome,
                        timed_out=report.failed and any(word in report.longreprtext for word in TIMEOUTS))

    def pytest_collectreport(self, report) -> None:
        if report.failed:  # a test file that cannot be imported: its cases are holes nobody counted
            self._write(type="case", case=report.nodeid, outcome="failed", timed_out=False)

    # -- recording ---------------------------------------------------------------------------

class _Tee:
    """Writes go to ``inner`` (pytest's capture) and to a copy the census reads."""

    def __init__(self, inner):
        self.inner = inner
        self.copy = io.StringIO()

    def write(self, text):
        self.copy.write(text)
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno...: the real stream's
        return getattr(self.inner, name)


def pytest_configure(config) -> None:
    """This module as a plugin (``-p census``): record into ``$EDGEBUILD_CENSUS_RECORD``."""
    path = os.environ.get(RECORD_ENV)
    if path and not config.pluginmanager.has_plugin("census-recorder"):
        recorder = Recorder(path)
        recorder.install()
        config.pluginmanager.register(recorder, "census-recorder")


def _argv(args) -> list[str]:
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()


def _is_edgebuild(args) -> bool:
    """``edgebuild ...`` or ``python -m edgebuild[.cli[.app]] ...``."""
    argv = _argv(args)
    modules = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"}
    return bool(argv) and (Path(argv[0]).name == "edgebuild" or bool(modules & {"edgebuild", "edgebuild.cli", "edgebuild.cli.app"}))


def _victims(root) -> dict[str, str]:
    """sha256 of every file below ``root`` whose path has a part named ``victim*`` (folders: their
    files, and the folder itself as "dir")."""
    import hashlib

    if root is None or not Path(root).is_dir():
        return {}
    found = {}
    for path in Path(root).rglob("victim*"):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            continue
        if path.is_dir():
            found[str(path)] = "dir"
            found.update((str(f), hashlib.sha256(f.read_bytes()).hexdigest()) for f in path.rglob("*")
                         if f.is_file() and not f.is_symlink())
        else:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _traceback(run: Run) -> bool:
    return not run.debug and bool(run.stderr) and any(mark in run.stderr for mark in TRACEBACK)


def _file(case: str) -> str:
    return Path(case.split("::", 1)[0]).name


def _matches(case: str, patterns) -> bool:
    return any(fnmatch.fnmatch(_file(case), pattern) for pattern in patterns)


def run_suite(pytest_args: list[str], files: list[Path], log) -> tuple[Census, int]:
    """Every test file in its own pytest process; (the census, the worst pytest exit code)."""
    census, worst = Census(), 0
    for path in files:
        with tempfile.NamedTemporaryFile("w+", suffix=".jsonl") as record:
            env = {**os.environ, RECORD_ENV: record.name,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "census",
                       str(path), *pytest_args]
            try:
                code = subprocess.run(command, env=env, stdout=log, stderr=log, timeout=FILE_SECONDS).returncode
            except subprocess.TimeoutExpired:
                code = 1
                census.timed_out.add(f"{path.relative_to(HERE.parent.parent)} (the whole file)")
            for line in Path(record.name).read_text().splitlines():
                census.add(json.loads(line))
        worst = max(worst, code if code != 5 else 0)  # 5: every case deselected
    return census, worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    known, pytest_args = parser.parse_known_args()
    files = sorted(HERE.glob("test_*.py"))
    census, code = run_suite(pytest_args, files, sys.stderr if known.json else sys.stdout)
    counts = census.counts()
    if known.json:
        print(json.dumps(counts, indent=2))
    else:
        for name, value in counts.items():
            if name == "per test file":
                print("per test file:")
                for file, outcomes in value.items():
                    print(f"  {file}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
            elif name in ("failed cases", "cases that lost files", "exit 2 without file:line", "traceback cases",
                          "hang cases"):
                for case in value:
                    print(f"  {name.removesuffix(' cases')}: {case}")
            else:
                print(f"{name}: {value}")
    return code


if __name__ == "__main__":
    sys.exit(main())
