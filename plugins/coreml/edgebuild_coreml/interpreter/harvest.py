"""Check the MIL interpreter against coremltools' own op tests.

coremltools ships per-op tests (``coremltools/converters/mil/mil/ops/tests/iOS*/test_*.py``)
that build a MIL program, give input values and the expected outputs, and hand them to
``run_compare_builder``, which would run Core ML. This module runs those tests under pytest
in a subprocess with ``run_compare_builder`` swapped for a capture (see
``_harvest_plugin``) that evaluates each program with the interpreter and records whether
the outputs match at the test's own tolerances. The summary counts vectors per op type.

    python -m edgebuild_coreml.interpreter.harvest [--ops conv,pool] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: Directory the capture plugin writes its JSON-lines records to.
RECORDS_ENV = "EDGEBUILD_HARVEST_DIR"
_TESTS_PACKAGE = "coremltools.converters.mil.mil.ops.tests"


def op_test_files(families: list[str] | None = None) -> list[str]:
    """coremltools' op test files, optionally only those whose name has one of ``families``."""
    root = Path(importlib.util.find_spec(_TESTS_PACKAGE).submodule_search_locations[0])
    files = sorted(glob.glob(str(root / "iOS1*" / "test_*.py")))
    if families:
        files = [f for f in files if any(fam in Path(f).stem for fam in families)]
    return files


def run_harvest(
    families: list[str] | None = None,
    *,
    keyword: str | None = None,
    workers: int = 1,
    timeout: float | None = None,
) -> dict:
    """Run the selected op tests with the capture plugin; return the summary dict."""
    files = op_test_files(families)
    if not files:
        raise ValueError(f"no coremltools op test file matches {families}")
    with tempfile.TemporaryDirectory(prefix="edgebuild-harvest-") as work:
        ini = Path(work) / "pytest.ini"
        ini.write_text("[pytest]\n")
        cmd = [
            sys.executable, "-m", "pytest", *files,
            "-c", str(ini), "--rootdir", work, "--noconftest", "-q", "-p", "no:cacheprovider",
            "-p", f"{__package__}._harvest_plugin", "-W", "ignore",
        ]
        if keyword:
            cmd += ["-k", keyword]
        if workers > 1:
            cmd += ["-n", str(workers)]
        env = dict(os.environ)
        env[RECORDS_ENV] = work
        # One config per opset: the ML Program backend (the NeuralNetwork one builds the same
        # programs again) at fp16, the precision Core ML tests run by default.
        env["PYMIL_TEST_TARGETS"] = "mlprogram"
        env.pop("INCLUDE_MIL_FP32_UNIT_TESTS", None)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=work)
        records = _read_jsonl(work, "records-")
        outcomes = _read_jsonl(work, "outcomes-")
    summary = summarize(records, outcomes)
    summary["files"] = [Path(f).parent.name + "/" + Path(f).name for f in files]
    summary["pytest_exit_code"] = proc.returncode
    summary["pytest_tail"] = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    if not records and proc.returncode not in (0, 1):
        summary["pytest_stderr"] = (proc.stderr or proc.stdout)[-2000:]
    return summary


def _read_jsonl(directory: str, prefix: str) -> list[dict]:
    rows = []
    for path in sorted(Path(directory).glob(f"{prefix}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


_VECTOR_STATUSES = ("matched", "mismatched", "eval_error")
_OP_NAME = re.compile(r" \(op '[^']*'\)|op '[^']*' ")  # group errors across op instances


def summarize(records: list[dict], outcomes: list[dict]) -> dict:
    """Counts over captured vectors, overall and per op type, plus the failures to look at."""
    vectors = [r for r in records if r["status"] in _VECTOR_STATUSES]
    totals = collections.Counter(r["status"] for r in records)
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in vectors:
        for op_type in r.get("ops", []):
            per_op[op_type]["captured"] += 1
            per_op[op_type][r["status"]] += 1
            per_op[op_type]["strict_matched"] += bool(r.get("strict"))
    errors = collections.Counter(
        _OP_NAME.sub("", r.get("error", "")) for r in vectors if r["status"] == "eval_error"
    )
    tests_with_vectors = {r["test"] for r in vectors}
    test_outcomes = collections.Counter(o["outcome"] for o in outcomes)
    without = [o for o in outcomes if o["test"] not in tests_with_vectors]
    captured = len(vectors)
    return {
        "vectors": {
            "captured": captured,
            "matched": totals["matched"],
            "mismatched": totals["mismatched"],
            "eval_error": totals["eval_error"],
            "strict_matched": sum(bool(r.get("strict")) for r in vectors),
            "match_rate": round(totals["matched"] / captured, 4) if captured else None,
        },
        "not_vectors": {
            "build_error": totals["build_error"],  # programs the tests expect to be invalid
            "no_expected_outputs": totals["no_vector"],
        },
        "tests": dict(test_outcomes),
        # Tests that check Core ML some other way (predict on a converted model, images,
        # state, compression) or are skipped on Linux: nothing for the interpreter to check.
        "tests_without_vectors": dict(collections.Counter(o["outcome"] for o in without)),
        "per_op": {op: dict(c) for op, c in sorted(per_op.items())},
        "mismatches": [
            {"test": r["test"], "ops": r.get("ops"), "excess": r.get("excess")}
            for r in vectors if r["status"] == "mismatched"
        ][:300],
        "eval_errors": [{"error": e, "count": n} for e, n in errors.most_common(60)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgebuild_coreml.interpreter.harvest", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--ops", help="comma-separated test families, e.g. conv,pool,activation")
    parser.add_argument("-k", "--keyword", help="pytest -k expression to narrow the tests")
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers")
    parser.add_argument("--json", dest="json_out", help="write the full summary here")
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.ops.split(",") if f.strip()] if args.ops else None
    summary = run_harvest(families, keyword=args.keyword, workers=args.workers)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
    v = summary["vectors"]
    print(
        f"vectors: {v['captured']} captured, {v['matched']} matched, {v['mismatched']} mismatched, "
        f"{v['eval_error']} errors (strict fp32: {v['strict_matched']}); tests: {summary['tests']}"
    )
    for op_type, counts in summary["per_op"].items():
        print(f"  {op_type:32s} {counts.get('matched', 0):5d}/{counts['captured']:<5d}")
    return 0 if v["captured"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
