"""The build's own process borrows torch's kernels for validation samples only once it has torch:
importing torch costs a fresh process more than a small net's samples take on numpy's kernels
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
