"""Run as a script (each call a fresh process, since what a process imports first decides how
coremltools is imported): ``make DIR`` saves the programs below as packages; ``read DIR`` reads
each back with the interpreter's loader, runs it, and prints one JSON line: per package its op
types, outputs, and whether sympy was imported by then; ``read-after-sympy DIR`` does the same
with sympy imported before coremltools (which then has it from the start)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

if sys.argv[1:2] == ["read-after-sympy"]:
    import sympy  # noqa: F401

import edgebuild_coreml  # noqa: F401 - its coremltools import, as a build's process has it

RNG = np.random.default_rng(0)
CONV_W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
DENSE_W = (0.1 * RNG.standard_normal((16, 64))).astype(np.float32)
X = RNG.random((1, 3, 8, 8), dtype=np.float32)
#: package -> (its input, whether reading it needs symbols: a range dimension is one)
INPUTS = {"fixed": (X, False), "palettized": (X, False), "flexible": (RNG.random((3, 5), dtype=np.float32), True)}


def _conv_net():
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 8, 8))])
    def prog(x):
        y = mb.relu(x=mb.conv(x=x, weight=CONV_W, pad_type="same"))
        y = mb.avg_pool(x=y, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid")
        y = mb.reshape(x=y, shape=[1, 64])
        return mb.softmax(x=mb.linear(x=y, weight=DENSE_W), axis=-1)

    return prog


def make(folder: Path) -> None:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import get_new_symbol
    from coremltools.optimize.coreml import OpPalettizerConfig, OptimizationConfig, palettize_weights

    def convert(prog, **kwargs):
        return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                          compute_precision=ct.precision.FLOAT32, skip_model_load=True, **kwargs)

    convert(_conv_net()).save(str(folder / "fixed.mlpackage"))
    config = OptimizationConfig(global_config=OpPalettizerConfig(nbits=4, weight_threshold=1))
    palettize_weights(convert(_conv_net()), config).save(str(folder / "palettized.mlpackage"))

    @mb.program(input_specs=[mb.TensorSpec(shape=(get_new_symbol(), 5))])
    def flexible(x):
        return mb.reduce_mean(x=mb.mul(x=x, y=2.0), axes=[1], keep_dims=True)

    convert(flexible, inputs=[ct.TensorType(name="x", shape=(ct.RangeDim(1, 8, 2), 5))]).save(
        str(folder / "flexible.mlpackage"))


def read(folder: Path) -> dict:
    from edgebuild_coreml.interpreter import load_mlpackage, run_program

    found = {}
    for name, (x, _) in INPUTS.items():
        program = load_mlpackage(folder / f"{name}.mlpackage")
        [input_name] = program.functions["main"].inputs
        outputs = run_program(program, {input_name: x})
        found[name] = {"ops": [op.op_type for op in program.functions["main"].operations],
                       "outputs": {k: np.asarray(v).tolist() for k, v in outputs.items()},
                       "sympy": "sympy" in sys.modules}
    return found


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        make(folder)
    else:
        print(json.dumps(read(folder)))
