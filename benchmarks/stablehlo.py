"""edgebuild's StableHLO frontend against a peer converter, stablehlo-coreml, on the same JAX models.

For each model (the Flax CNN, BERT-style encoder and GRU-with-scan of the frontend's architecture
tests, plus single-op cases: conv_transpose, sort, gather, while), in one run:

- the model is exported with ``jax.export`` in this interpreter (edgebuild's JAX) and written as
  ``MODEL.jaxexport``, its MLIR text and its portable artifact;
- **edgebuild**: ``edgebuild run MODEL.yaml`` in a fresh process, on a recipe naming ``MODEL.jaxexport``
  (``edgebuild convert`` takes only ONNX sources): fp16, validation against JAX included but with no
  threshold to fail; its seconds are the wall time less the validate stage's;
- **peer**: ``stablehlo_coreml.convert(module, minimum_deployment_target=iOS18)`` then
  ``ct.convert(program, source="milinternal", pass_pipeline=DEFAULT_HLO_PIPELINE)`` (ct.convert's
  default fp16) in a fresh process of the peer's own venv, which pins an older JAX: the module is
  parsed from the MLIR text there, or, when that JAX cannot read it, from the portable artifact;
- **numerics**: ``edgebuild verify`` takes only an ONNX reference, so both packages are run here by
  edgebuild's MIL interpreter (the runtime ``verify`` picks for an .mlpackage) on the same random
  inputs, and compared with what JAX computes: the lowest cosine over the outputs.

The peer's venv is made on first use under ``build/peer-venvs/`` (``python -m venv``, then pip with
the project's newest constraints less the JAX pins, which the peer sets itself). ``--json`` prints
the rows. Seconds (``s``) are each fresh process's wall time, interpreter start and imports included
(edgebuild's less its validate stage); ``work s`` leaves those out (edgebuild: its import, optimise,
lower and package stages; the peer: parse, convert, ct.convert and save). The ratios are edgebuild's
over the peer's, on the models both convert.

    python benchmarks/stablehlo.py [--models cnn,sort] [--venv DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEER = "stablehlo-coreml-experimental==0.0.18"
PEER_PINS = ("jax==0.9.1", "jaxlib==0.9.1", PEER, "coremltools==9.0", "numpy")
UNPINNED = ("jax", "jaxlib")  # the peer pins its own JAX; the project's newer pins would conflict
WAIT = 1800

# runs in the peer's venv: argv = MLIR text, portable artifact, output package; prints one JSON line
PEER_CONVERT = r"""
import json, sys, time
start = time.perf_counter()
import coremltools as ct
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib.mlir import ir
from stablehlo_coreml import DEFAULT_HLO_PIPELINE, convert
imported = time.perf_counter() - start
text, artifact, out = sys.argv[1:4]
start = time.perf_counter()
context = jax_mlir.make_ir_context()
try:
    module, read_from = ir.Module.parse(open(text).read(), context=context), "text"
except Exception:
    from jax._src.lib.mlir.dialects import stablehlo
    module = ir.Module.parse(stablehlo.deserialize_portable_artifact(open(artifact, "rb").read()), context=context)
    read_from = "portable artifact"
program = convert(module, minimum_deployment_target=ct.target.iOS18)
model = ct.convert(program, source="milinternal", minimum_deployment_target=ct.target.iOS18,
                   pass_pipeline=DEFAULT_HLO_PIPELINE)
model.save(out)
print(json.dumps({"seconds": time.perf_counter() - start, "imports_s": imported, "read_from": read_from}))
"""


def peer_venv(venv: Path) -> Path:
    """The peer venv's python, made (and its packages installed) when missing."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    print(f"making {venv} (a few minutes)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=WAIT)
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text(peer_constraints((ROOT / "constraints" / "newest.txt").read_text()))
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PINS, "-c", str(constraints)],
                       check=True, timeout=WAIT)
    return python


def peer_constraints(newest: str) -> str:
    """The project's constraints less the pins the peer sets itself."""
    def name(line: str) -> str:
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        return re.sub(r"[-_.]+", "-", found.group(1)).lower() if found else ""

    return "".join(line + "\n" for line in newest.splitlines() if name(line) not in UNPINNED)


ERROR_LINE = re.compile(r"^(error\b|[\w.]*(Error|Exception)\b)", re.IGNORECASE)


def first_line(text: str) -> str:
    """The line of a failure's output that says what failed: the last one that names an error
    (a hint or a dump of the module may follow it), else the last non-empty one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    chosen = errors[-1] if errors else lines[-1] if lines else "no output"
    return chosen[:160]


# --- models --------------------------------------------------------------------------------------

def models() -> dict:
    """name -> (function, example arrays, integer inputs' ranges by the frontend's input names):
    the frontend's architecture tests' Flax models and single-op cases."""
    sys.path.insert(0, str(ROOT / "plugins" / "jax" / "tests"))
    import jax
    import jax.numpy as jnp
    from jax import lax

    import test_jax_architectures as arch

    rng = np.random.default_rng(0)
    image = rng.standard_normal((1, 32, 32, 3)).astype(np.float32)
    ids = rng.integers(0, 50, (2, 8)).astype(np.int32)
    sequence = rng.standard_normal((2, 6, 8)).astype(np.float32)
    kernel = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    table = rng.standard_normal((20, 16)).astype(np.float32)

    def conv_transpose(x):
        return lax.conv_transpose(x, kernel, strides=(2, 2), padding="SAME",
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def gather(positions):
        return jnp.take(table, positions, axis=0)

    def while_loop(x):
        return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 0.9 + 1.0), (0, x))[1]

    return {
        "cnn": (arch.bound(arch.ResidualCNN(), image), [image], {}),
        "bert": (arch.bound(arch.Encoder(), ids), [ids], {"input_0": (0, 49)}),
        "gru_scan": (arch.bound(arch.GRUClassifier(), sequence), [sequence], {}),
        "conv_transpose": (conv_transpose, [rng.standard_normal((1, 8, 8, 4)).astype(np.float32)], {}),
        "sort": (lambda x: jnp.sort(x, axis=-1), [rng.standard_normal((4, 32)).astype(np.float32)], {}),
        "gather": (gather, [rng.integers(0, 20, (6,)).astype(np.int32)], {"positions": (0, 19)}),
        "while": (while_loop, [rng.standard_normal((3, 5)).astype(np.float32)], {}),
    }


def export(fn, arrays, work: Path, name: str):
    """``MODEL.jaxexport``, its MLIR text and portable artifact; and JAX's outputs on ``arrays``."""
    import jax
    from jax import export as jax_export

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    exported = jax_export.export(jax.jit(fn))(*specs)
    (work / f"{name}.jaxexport").write_bytes(exported.serialize())
    (work / f"{name}.mlir").write_text(exported.mlir_module())
    (work / f"{name}.stablehlo").write_bytes(bytes(exported.mlir_module_serialized))
    return [np.asarray(w) for w in jax.tree_util.tree_leaves(exported.call(*arrays))]


# --- measurements --------------------------------------------------------------------------------

def recipe_text(name: str, integers: dict | None = None) -> str:
    """The recipe edgebuild builds ``MODEL.jaxexport`` with: fp16 as ct.convert's default, the
    validate stage on (it is part of a build) but with no threshold to fail, so a package whose
    numbers are off still counts as converted and its cosine is judged below like the peer's.
    ``integers``: input name -> (low, high) of an integer input (ids, positions), which validation
    cannot draw without its range."""
    drawn = ", ".join(f"{input_name}: {{random: {{low: {low}, high: {high}, seed: 0}}}}"
                      for input_name, (low, high) in (integers or {}).items())
    return (f"edgebuild: 1\nname: {name}\nsource: {{model: {name}.jaxexport}}\n"
            "target: {backend: coreml, precision: float16}\n"
            f"validate: {{samples: 4, inputs: {{{drawn}}}, thresholds: {{cosine_min: -1.0}}}}\n"
            f"outputs: {{dir: {name}.edgebuild}}\n")


def convert_edgebuild(work: Path, name: str, integers: dict) -> dict:
    recipe = work / f"{name}.yaml"
    recipe.write_text(recipe_text(name, integers))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", "run", recipe.name, "--json",
                           "--cache-dir", str(work / "store")], cwd=work, capture_output=True, text=True,
                          timeout=WAIT)
    wall = time.perf_counter() - start
    packages = list((work / f"{name}.edgebuild").glob("*/model.mlpackage"))
    if done.returncode not in (0, 3) or not packages:
        return {"converts": False, "error": first_line(done.stderr or done.stdout), "wall_s": wall}
    [variant] = json.loads(done.stdout)["variants"]
    stages = {s["name"]: s["seconds"] for s in variant["stages"]}
    work_s = sum(seconds for stage, seconds in stages.items() if stage not in ("resolve", "validate"))
    return {"converts": True, "error": None, "wall_s": wall, "stages_s": stages,
            "seconds": wall - stages.get("validate", 0.0), "work_s": work_s, "package": str(packages[0])}


def convert_peer(python: Path, work: Path, name: str) -> dict:
    out = work / f"{name}.peer.mlpackage"
    start = time.perf_counter()
    done = subprocess.run([str(python), "-c", PEER_CONVERT, str(work / f"{name}.mlir"),
                           str(work / f"{name}.stablehlo"), str(out)], cwd=work, capture_output=True, text=True,
                          timeout=WAIT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"converts": False, "error": first_line(done.stderr or done.stdout), "wall_s": wall}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"converts": True, "error": None, "wall_s": wall, "seconds": wall, "work_s": found["seconds"],
            "read_from": found["read_from"], "package": str(out)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0:
        return 1.0 if np.allclose(a, b) else 0.0
    return float(a @ b / norms)


def package_cosine(package: str, arrays, want) -> tuple[float | None, str | None]:
    """The lowest cosine, over the outputs, of ``package`` run by edgebuild's MIL interpreter
    against JAX (inputs fed in the package's order, outputs compared in its order)."""
    from edgebuild.registry import get_registry

    registry = get_registry()
    path = Path(package)
    runtimes = sorted((registry.get("runtimes", n) for n in registry.names("runtimes")), key=lambda r: r.native)
    runtime = next((r for r in runtimes if r.can_run(path)), None)
    if runtime is None:
        return None, "no runtime reads it"
    try:
        names = runtime.input_names(path)
        produced = runtime.run(path, dict(zip(names, arrays)))
        got = list(produced.values())
        if len(got) != len(want):
            return None, f"{len(got)} outputs, JAX has {len(want)}"
        return min(cosine(g, w) for g, w in zip(got, want)), None
    except Exception as exc:  # a package the interpreter cannot run is a result, not a crash
        return None, first_line(f"{type(exc).__name__}: {exc}")


def measure(name: str, fn, arrays, integers: dict, python: Path, work: Path) -> dict:
    want = export(fn, arrays, work, name)
    row = {"model": name}
    for side, convert in (("edgebuild", lambda: convert_edgebuild(work, name, integers)),
                          ("peer", lambda: convert_peer(python, work, name))):
        result = convert()
        if result["converts"]:
            result["cosine"], result["run_error"] = package_cosine(result["package"], arrays, want)
        row[side] = result
    row["ratio"], row["work_ratio"] = ratio(row, "seconds"), ratio(row, "work_s")
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def ratio(row: dict, key: str) -> float | None:
    """edgebuild's seconds (``key``) over the peer's, when both converted."""
    ours, theirs = row["edgebuild"], row["peer"]
    if ours["converts"] and theirs["converts"] and theirs[key] > 0:
        return ours[key] / theirs[key]
    return None


# --- output --------------------------------------------------------------------------------------

def cells(result: dict) -> list[str]:
    if not result["converts"]:
        return ["no: " + (result["error"] or "")[:48], "-", "-", "-"]
    found = result.get("cosine")
    shown = f"{found:.7f}" if found is not None else "run: " + (result.get("run_error") or "")[:30]
    return ["yes", f"{result['seconds']:.2f}", f"{result['work_s']:.2f}", shown]


def table(rows: list[dict]) -> str:
    heads = ["model", "edgebuild", "s", "work s", "cosine", "peer", "s", "work s", "cosine", "ratio", "work ratio"]
    body = [[row["model"], *cells(row["edgebuild"]), *cells(row["peer"]),
             *(f"{row[k]:.2f}" if row[k] is not None else "-" for k in ("ratio", "work_ratio"))] for row in rows]
    widths = [max(len(r[i]) for r in [heads, *body]) for i in range(len(heads))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in [heads, *body]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "peer-venvs" / "stablehlo-coreml-0.0.18")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = models()
    chosen = args.models.split(",") if args.models else list(cases)
    unknown = [name for name in chosen if name not in cases]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(cases)}")
    python = peer_venv(args.venv.resolve())  # the peer runs in a scratch folder: an absolute path
    with tempfile.TemporaryDirectory() as scratch:
        rows = [measure(name, *cases[name], python, Path(scratch)) for name in chosen]
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
