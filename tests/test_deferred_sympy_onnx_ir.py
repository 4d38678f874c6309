"""onnx_ir imported through edgebuild imports sympy only once a symbolic dim is computed with
(edgebuild.deferred_sympy): its symbolic dims parse, compute and evaluate as with sympy imported
first, and everyone else gets sympy itself. Each case in a fresh process: what a process imported
first decides how onnx_ir is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# what a graph's symbolic dims are asked for, through onnx_ir's own API: the functions its parser
# keeps in a table at import time, arithmetic, evaluation and simplification
DIMS = """
import onnx_ir as ir
dims = [ir.SymbolicDim(text) for text in ("N", "max(N, 4)", "min(N, 2) + 1", "floor(N / 2)", "Mod(N, 3)",
                                            "sqrt(N*N)", "N*2 - 1")]
found = {"text": [str(d) for d in dims], "sympy_before": "sympy" in sys.modules}
found["evaluated"] = [int(d.evaluate({"N": 9})) for d in dims]
found["sum"] = str((dims[0] + 3) * 2)
found["simplified"] = str((dims[0] + dims[0]).simplify())
found["sympy_after"] = "sympy" in sys.modules
"""


def run_fresh(code: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def dims_after(first: str, **env) -> dict:
    return run_fresh(f"import json, sys\n{first}\n{DIMS}\nprint(json.dumps(found))", **env)


EXPECTED = {"text": ["N", "max(N, 4)", "min(N, 2) + 1", "floor(N / 2)", "Mod(N, 3)", "sqrt(N*N)", "N*2 - 1"],
            "evaluated": [9, 9, 3, 4, 0, 9, 17]}


def test_importing_onnx_ir_through_edgebuild_leaves_sympy_out_until_a_dim_is_computed_with():
    found = dims_after("import edgebuild\nimport onnx_ir")
    assert found["sympy_before"] is False
    assert found["sympy_after"] is True
    assert {key: found[key] for key in EXPECTED} == EXPECTED


@pytest.mark.parametrize("first", ["import sympy", "import onnx_ir", "import os; os.environ['EDGEBUILD_EAGER_SYMPY'] = '1'"])
def test_dims_compute_alike_however_the_process_started(first):
    lean = dims_after("import edgebuild")
    other = dims_after(f"{first}\nimport edgebuild")
    assert {key: other[key] for key in (*EXPECTED, "sum", "simplified")} == \
        {key: lean[key] for key in (*EXPECTED, "sum", "simplified")}
    assert other["sympy_before"] is True  # sympy itself from the start: nothing is deferred


def test_sympy_classes_are_sympy_s_own_for_everyone_once_imported():
    found = run_fresh("""
import json, sys
import edgebuild, onnx_ir
from onnx_ir import _core
import sympy
x = sympy.Symbol("x")
print(json.dumps({"module": sympy.Basic.__module__, "stand_in_checks": isinstance(x, _core.sympy.Expr),
                  "dim": str(onnx_ir.SymbolicDim(x + 1)), "real": sys.modules["sympy"] is sympy}))
""")
    assert found == {"module": "sympy.core.basic", "stand_in_checks": True, "dim": "x + 1", "real": True}


def test_a_graph_with_symbolic_dims_round_trips_through_onnx_ir():
    found = run_fresh("""
import json, sys
import edgebuild, onnx, onnx_ir as ir
from onnx import helper, TensorProto
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
model = ir.serde.deserialize_model(helper.make_model(graph))
back = ir.serde.serialize_model(model)
print(json.dumps({"dims": [str(d) for d in model.graph.inputs[0].shape],
                  "back": back.graph.input[0].type.tensor_type.shape.dim[0].dim_param,
                  "sympy": "sympy" in sys.modules}))
""")
    assert found == {"dims": ["batch", "3"], "back": "batch", "sympy": False}
