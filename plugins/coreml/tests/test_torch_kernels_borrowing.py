"""The build's own process borrows torch's kernels for validation samples once it has torch, or once
the samples on numpy's kernels have taken as long as importing it costs: importing torch costs a
fresh process more than a small net's samples take on numpy's kernels, and less than a large one's
(torch_kernels.for_calls). Fresh processes: what a process imported decides."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PROBE = """
import json, sys
from edgebuild_coreml.interpreter import torch_kernels
found = {}
with torch_kernels.for_calls():
    found["before"] = [torch_kernels.enabled(), "torch" in sys.modules]
import torch
torch.set_num_threads(2)
with torch_kernels.for_calls(threads=1):
    found["after"] = [torch_kernels.enabled(), torch.get_num_threads()]
found["restored"] = torch.get_num_threads()
found["outside"] = torch_kernels.enabled()
print(json.dumps(found))
"""


def test_for_calls_borrows_torch_once_the_process_has_it_and_never_imports_it():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"before": [False, False], "after": [True, 1], "restored": 2, "outside": False}


RENT_OR_BUY = """
import json, sys, time
from edgebuild_coreml.interpreter import torch_kernels
found = {}
with torch_kernels.for_calls():
    found["first"] = [torch_kernels.enabled(), "torch" in sys.modules]
    time.sleep(0.05)
found["counted"] = torch_kernels._numpy_seconds >= 0.05
torch_kernels._numpy_seconds = torch_kernels.TORCH_IMPORT_SECONDS  # as long as an import would take
with torch_kernels.for_calls():
    found["then"] = [torch_kernels.enabled(), "torch" in sys.modules]
print(json.dumps(found))
"""


def test_for_calls_imports_torch_once_the_blocks_on_numpy_have_taken_as_long_as_importing_it():
    done = subprocess.run([sys.executable, "-c", RENT_OR_BUY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"first": [False, False], "counted": True, "then": [True, True]}
