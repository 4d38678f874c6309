"""Palettisation: coremltools' own k-means (scikit-learn) against edgebuild's fast 1-D k-means.

Both run end to end through ``coremltools.optimize.coreml.palettize_weights`` on the same
model; the table shows wall time and total weight error (sum over weights of
||W - W_hat||^2 / n), and the ratios ours / coremltools'.

    python benchmarks/palettize.py [--model minilm.mlpackage] [--quick]

Without --model the MiniLM rows are skipped. The synthetic model (24 linears of 2048x2048,
about 100M parameters; 4 of 512x512 with --quick) is cached in the temp directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.optimize._utils import lut_to_dense

from edgebuild_coreml.compress.apply import plan_weight_passes
from edgebuild_coreml.compress.config import validate_compression
from edgebuild_coreml.compress.program import iter_ops, load_program

CONFIGS = {
    "4-bit per-tensor": {"mode": "palettize", "nbits": 4},
    "4-bit grouped/16": {
        "mode": "palettize",
        "nbits": 4,
        "granularity": "per_grouped_channel",
        "group_size": 16,
    },
}


def synthetic_model(layers: int, width: int) -> Path:
    """A chain of ``layers`` linears of width x width with N(0, 1/width) weights (fp16)."""
    path = Path(tempfile.gettempdir()) / f"edgebuild-bench-linear{layers}x{width}.mlpackage"
    if path.exists():
        return path
    rng = np.random.default_rng(0)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, width))], opset_version=ct.target.iOS18)
    def program(x):
        for index in range(layers):
            weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            x = mb.linear(x=x, weight=weight, name=f"fc{index}")
        return x

    model = ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )
    staging = path.with_name(f"{path.stem}.{os.getpid()}.mlpackage")
    model.save(str(staging))
    os.replace(staging, path)
    return path


def original_weights(model) -> dict[str, np.ndarray]:
    return {
        op.name: op.outputs[0].val.astype(np.float64)
        for op in iter_ops(load_program(model))
        if op.op_type == "const"
        and isinstance(op.outputs[0].val, np.ndarray)
        and op.outputs[0].val.size > 2048
    }


def weight_error(compressed, originals: dict[str, np.ndarray]) -> float:
    """Sum over palettised weights of the mean squared error against the original."""
    total, seen = 0.0, 0
    for op in iter_ops(load_program(compressed)):
        if op.op_type != "constexpr_lut_to_dense":
            continue
        original = originals[op.name.removesuffix("_palettized")]
        vector_axis = op.vector_axis.val if op.vector_axis is not None else None
        dense = lut_to_dense(op.indices.val, op.lut.val, vector_axis).astype(np.float64)
        total += float(np.mean((dense - original) ** 2))
        seen += 1
    if seen == 0:
        raise SystemExit("no weight was palettised; is the model an ML program with weights?")
    return total


def run_coremltools(model, weights: dict):
    config = cto.OptimizationConfig(
        global_config=cto.OpPalettizerConfig(
            mode="kmeans",
            nbits=weights["nbits"],
            granularity=weights.get("granularity", "per_tensor"),
            group_size=weights.get("group_size", 32),
        )
    )
    return cto.palettize_weights(model, config)


def run_ours(model, weights: dict):
    (stage,) = plan_weight_passes(validate_compression({"weights": weights}), load_program(model))
    return stage.run(model)


def measure(path: Path, label: str, rows: list) -> None:
    model = ct.models.MLModel(str(path), skip_model_load=True)
    originals = original_weights(model)
    params = sum(w.size for w in originals.values())
    for config_name, weights in CONFIGS.items():
        results = {}
        for who, run in (("coremltools", run_coremltools), ("edgebuild", run_ours)):
            start = time.perf_counter()
            compressed = run(model, weights)
            seconds = time.perf_counter() - start
            results[who] = (seconds, weight_error(compressed, originals))
            print(f"  {label} {config_name} {who}: {seconds:.1f} s", flush=True)
        rows.append((label, params, config_name, results))


def print_table(rows: list) -> None:
    header = f"{'model':<12}{'params':>8}  {'config':<18}{'ct s':>9}{'ours s':>9}{'speed-up':>10}"
    header += f"{'ct MSE':>12}{'our MSE':>12}{'MSE ratio':>11}"
    print(header)
    print("-" * len(header))
    for label, params, config_name, results in rows:
        ct_s, ct_err = results["coremltools"]
        our_s, our_err = results["edgebuild"]
        print(
            f"{label:<12}{params / 1e6:>7.1f}M  {config_name:<18}{ct_s:>9.2f}{our_s:>9.2f}"
            f"{ct_s / our_s:>9.1f}x{ct_err:>12.4g}{our_err:>12.4g}{our_err / ct_err:>11.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="paraphrase-MiniLM-L3-v2 as an .mlpackage")
    parser.add_argument("--quick", action="store_true", help="a small synthetic model instead")
    args = parser.parse_args()
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    os.environ.setdefault("TQDM_DISABLE", "1")

    rows: list = []
    if args.model:
        measure(args.model, "MiniLM-L3", rows)
    else:
        print("no --model given: skipping paraphrase-MiniLM-L3-v2")
    layers, width = (4, 512) if args.quick else (24, 2048)
    measure(synthetic_model(layers, width), f"linear{layers}x{width}", rows)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
