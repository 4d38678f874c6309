"""The reliability suite's counts, from what its tests did rather than from prose:

    python tests/reliability/census.py [--json] [pytest arguments...]

runs every test under tests/reliability (pytest, in this process, one at a time) and counts:

- inputs tried: test cases run (a parametrized case is one hostile or broken input or race);
- CLI runs: every ``edgebuild`` command the cases ran, in a subprocess or in this process, by
  exit code; "exit 2 with file:line": those that exit 2 naming a recipe, config or JSON file
  with its line;
- tracebacks: CLI runs (without ``--debug``) whose error output holds a Python traceback or
  "internal error";
- hangs: cases that failed on a timeout (a subprocess that did not end, a bounded wait that ran out);
- user files lost, forged or corrupt entries served: failed cases of the test files that put a
  victim file beside the command, or feed the store and the remote damaged or forged entries
  (``FILES_LOST`` and ``ENTRIES_SERVED`` below name them);
- failed and skipped cases, overall and per test file.

A case that passes held its property (its assertions say which); a failed one is a hole.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# the test files whose failures are a user's file lost, or a bad entry served (glob patterns)
FILES_LOST = ("test_outputs.py", "test_owned_outputs.py", "test_generated_files.py", "test_hostile_keys.py",
              "test_make*.py", "test_depfile*.py")
ENTRIES_SERVED = ("test_store.py", "test_remote*.py", "test_forged*.py", "test_signed*.py", "test_entry_layout*.py")

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
    """A pytest plugin recording each case's outcome and each edgebuild command's exit and error output."""

    runs: list[Run] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # case -> passed | failed | skipped
    timed_out: set[str] = field(default_factory=set)
    current: str = ""

    # -- recording ---------------------------------------------------------------------------

    def pytest_configure(self, config) -> None:
        # before collection: test modules that import main or Popen get the recording ones
        self._patch_popen()
        self._patch_main()

    def _record(self, code, stderr, args) -> None:
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
        self.runs.append(Run(self.current, code, stderr, "--debug" in [str(a) for a in args]))

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

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            if self.outcomes.get(report.nodeid) != "failed":  # a teardown error after a pass still fails
                self.outcomes[report.nodeid] = report.outcome
        if report.failed and any(word in report.longreprtext for word in TIMEOUTS):
            self.timed_out.add(report.nodeid)

    def pytest_collectreport(self, report) -> None:
        if report.failed:  # a test file that cannot be imported: its cases are holes nobody counted
            self.outcomes[report.nodeid] = "failed"

    # -- counting ------------------------------------------------------------------------------

    def counts(self) -> dict:
        failed = {case for case, outcome in self.outcomes.items() if outcome == "failed"}
        codes = Counter(run.code for run in self.runs)
        exit2 = [run for run in self.runs if run.code == 2]
        per_file: dict[str, Counter] = {}
        for case, outcome in self.outcomes.items():
            per_file.setdefault(_file(case), Counter())[outcome] += 1
        return {
            "inputs tried": len(self.outcomes),
            "cases passed": sum(1 for o in self.outcomes.values() if o == "passed"),
            "cases failed": len(failed),
            "cases skipped": sum(1 for o in self.outcomes.values() if o == "skipped"),
            "CLI runs": len(self.runs),
            "CLI runs by exit code": {str(code): n for code, n in sorted(codes.items(), key=lambda kv: str(kv[0]))},
            "exit 2": len(exit2),
            "exit 2 with file:line": sum(1 for run in exit2 if run.stderr and FILE_LINE.search(run.stderr)),
            "tracebacks": sum(1 for run in self.runs if not run.debug and run.stderr
                              and any(mark in run.stderr for mark in TRACEBACK)),
            "hangs": len(self.timed_out),
            "user files lost": sum(1 for case in failed if _matches(case, FILES_LOST)),
            "forged or corrupt entries served": sum(1 for case in failed if _matches(case, ENTRIES_SERVED)),
            "per test file": {name: dict(counter) for name, counter in sorted(per_file.items())},
            "failed cases": sorted(failed),
            "exit 2 without file:line": sorted({run.case for run in exit2
                                                if not (run.stderr and FILE_LINE.search(run.stderr))}),
        }


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


def _argv(args) -> list[str]:
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()


def _is_edgebuild(args) -> bool:
    """``edgebuild ...`` or ``python -m edgebuild[.cli[.app]] ...``."""
    argv = _argv(args)
    modules = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"}
    return bool(argv) and (Path(argv[0]).name == "edgebuild" or bool(modules & {"edgebuild", "edgebuild.cli", "edgebuild.cli.app"}))


def _file(case: str) -> str:
    return Path(case.split("::", 1)[0]).name


def _matches(case: str, patterns) -> bool:
    return any(fnmatch.fnmatch(_file(case), pattern) for pattern in patterns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    known, pytest_args = parser.parse_known_args()
    census = Census()
    with contextlib.redirect_stdout(sys.stderr if known.json else sys.stdout):  # --json: stdout holds the counts only
        code = pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(HERE), *pytest_args],
                           plugins=[census])
    counts = census.counts()
    if known.json:
        print(json.dumps(counts, indent=2))
    else:
        for name, value in counts.items():
            if name == "per test file":
                print("per test file:")
                for file, outcomes in value.items():
                    print(f"  {file}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
            elif name in ("failed cases", "exit 2 without file:line"):
                for case in value:
                    print(f"  {name.removesuffix(' cases')}: {case}")
            else:
                print(f"{name}: {value}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
