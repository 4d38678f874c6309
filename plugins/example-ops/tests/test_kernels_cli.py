"""`edgebuild kernels` checks the installed custom-op kernels against their references."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("edgebuild_msl")  # the [msl] extra: `edgebuild kernels` is its command


def test_kernels_command_checks_the_example_kernel():
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "kernels", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {r["op"]: r for r in json.loads(done.stdout)["kernels"]}
    assert rows["com.example::RMSNorm"]["status"] == "pass"
    assert rows["com.example::RMSNorm"]["max_abs_err"] < 1e-5


def test_a_tolerance_below_the_error_fails_with_exit_1():
    done = subprocess.run([sys.executable, "-m", "edgebuild.cli.app", "kernels", "--tolerance", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "fail" in done.stdout and "com.example::RMSNorm" in done.stdout
