"""edgebuild's StableHLO frontend against a peer converter, stablehlo-coreml, on the same JAX models.

Two modes, each in one run.

**Models** (the default). For each model (the Flax CNN, BERT-style encoder and GRU-with-scan of the
frontend's architecture tests, plus single-op cases: conv_transpose, sort, gather, while):

- the model is exported with ``jax.export`` in this interpreter (edgebuild's JAX) and written as
  ``MODEL.jaxexport``, its MLIR text and its portable artifact;
- **edgebuild**: ``edgebuild run MODEL.yaml`` in a fresh process, on a recipe naming ``MODEL.jaxexport``
  (``edgebuild convert`` takes only ONNX sources): fp16, validation against JAX included but with no
  threshold to fail; its seconds are the wall time less the validate stage's;
- **peer**: ``stablehlo_coreml.convert(module, minimum_deployment_target=iOS18)`` then
  ``ct.convert(program, source="milinternal", pass_pipeline=DEFAULT_HLO_PIPELINE)`` (ct.convert's
  default fp16) in a fresh process of the peer's own venv, which pins an older JAX: the module is
  parsed from the MLIR text there, or, when that JAX cannot read it, from the portable artifact.
  The package's metadata then records the export's names for its inputs and outputs, in order (the
  peer writes ``_arg0``, ``real_div_0``, ...), as edgebuild's packages record a renamed tensor
  (``com.edgebuild.tensor_names``), so both packages are verified alike;
- **numerics**: each package is checked by ``edgebuild verify`` against ``MODEL.jaxexport`` (the
  function it calls, ``edgebuild.cli.verify.verify_artifact``, in this process): JAX runs the
  export, edgebuild's MIL interpreter runs the package, on the same random inputs (floats normal,
  integers from their range); the row shows the lowest cosine over the outputs.

Seconds (``s``) are each fresh process's wall time, interpreter start and imports included
(edgebuild's less its validate stage); ``work s`` leaves those out (edgebuild: its import, optimise,
lower and package stages; the peer: parse, convert, ct.convert and save). The ratios are edgebuild's
over the peer's, on the models both convert.

**Conformance** (``--conformance``): every case of edgebuild's ``stablehlo`` conformance suite
(``edgebuild conformance --suite stablehlo``: ``jax.lax`` primitives over their dtype and attribute
variants) is exported, converted by both at float32 (edgebuild: one ``edgebuild run`` over all the
cases' recipes; the peer: one process over all cases) and verified by ``edgebuild verify`` against
its export, inputs drawn as the suite draws them (indices and divisors positive and in range), one
sample per case as the suite runs it. A case is correct when every output keeps cosine >= 0.9999 and
max relative error <= 1e-2 (float16 cases: 0.999 and 5e-2). The table has per primitive, for each tool, whether its cases convert and are
correct ("yes", "no", or how many of them), and the totals.

The peer's venv is made on first use under ``build/peer-venvs/`` (``python -m venv``, then pip with
the project's newest constraints less the JAX pins, which the peer sets itself). ``--json`` prints
the rows.

    python benchmarks/stablehlo.py [--models cnn,sort] [--venv DIR] [--json]
    python benchmarks/stablehlo.py --conformance [--ops add,sort] [--venv DIR] [--json]
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

# runs in the peer's venv: argv = a job file ({"precision", "cases": [{"name", "text", "artifact", "out",
# "inputs", "outputs"}]}); prints one JSON line per case as it is done
PEER_CONVERT = r"""
import json, sys, time
start = time.perf_counter()
import coremltools as ct
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib.mlir import ir
from stablehlo_coreml import DEFAULT_HLO_PIPELINE, convert
imported = time.perf_counter() - start
job = json.load(open(sys.argv[1]))
precision = ct.precision.FLOAT32 if job["precision"] == "float32" else ct.precision.FLOAT16


def named(model, case):
    # the export's names for the peer's (_arg0, real_div_0, ...), in order, where edgebuild's own packages
    # record theirs: verify then feeds and reads the package by the export's names, the program untouched
    spec, names = model.get_spec(), {}
    for side in ("input", "output"):
        theirs = [f.name for f in getattr(spec.description, side)]
        names[side + "s"] = {ours: name for ours, name in zip(case[side + "s"], theirs) if ours != name}
    model.user_defined_metadata["com.edgebuild.tensor_names"] = json.dumps(names)
    return model


for case in job["cases"]:
    start = time.perf_counter()
    try:
        context = jax_mlir.make_ir_context()
        try:
            module, read_from = ir.Module.parse(open(case["text"]).read(), context=context), "text"
        except Exception:
            from jax._src.lib.mlir.dialects import stablehlo
            portable = stablehlo.deserialize_portable_artifact(open(case["artifact"], "rb").read())
            module, read_from = ir.Module.parse(portable, context=context), "portable artifact"
        program = convert(module, minimum_deployment_target=ct.target.iOS18)
        model = ct.convert(program, source="milinternal", minimum_deployment_target=ct.target.iOS18,
                           compute_precision=precision, pass_pipeline=DEFAULT_HLO_PIPELINE)
        named(model, case).save(case["out"])
        found = {"converts": True, "seconds": time.perf_counter() - start, "read_from": read_from}
    except Exception as exc:
        found = {"converts": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"name": case["name"], "imports_s": imported, **found}), flush=True)
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


def export(fn, arrays, work: Path, name: str) -> Path:
    """``MODEL.jaxexport``, its MLIR text and portable artifact, for the shapes and dtypes of ``arrays``."""
    import jax
    from jax import export as jax_export

    from edgebuild_jax.conformance_integers import needs_x64

    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in arrays]
    with jax.enable_x64(needs_x64(fn, arrays)):  # 64-bit cases are traced as the suite traces them
        exported = jax_export.export(jax.jit(fn))(*specs)
    (work / f"{name}.jaxexport").write_bytes(exported.serialize())
    (work / f"{name}.mlir").write_text(exported.mlir_module())
    (work / f"{name}.stablehlo").write_bytes(bytes(exported.mlir_module_serialized))
    return work / f"{name}.jaxexport"


# --- measurements --------------------------------------------------------------------------------

def recipe_text(name: str, integers: dict | None = None, *, precision: str = "float16",
                validate: bool = True) -> str:
    """The recipe edgebuild builds ``MODEL.jaxexport`` with: fp16 as ct.convert's default, the
    validate stage on (it is part of a build) but with no threshold to fail, so a package whose
    numbers are off still counts as converted and is judged by ``verify`` like the peer's.
    ``integers``: input name -> (low, high) of an integer input (ids, positions), which validation
    cannot draw without its range. ``validate=False`` (the conformance mode): no validate stage,
    as ``verify`` judges every package."""
    drawn = ", ".join(f"{input_name}: {{random: {{low: {low}, high: {high}, seed: 0}}}}"
                      for input_name, (low, high) in (integers or {}).items())
    checked = (f"validate: {{samples: 4, inputs: {{{drawn}}}, thresholds: {{cosine_min: -1.0}}}}\n"
               if validate else "")
    return (f"edgebuild: 1\nname: {name}\nsource: {{model: {name}.jaxexport}}\n"
            f"target: {{backend: coreml, precision: {precision}}}\n{checked}"
            f"outputs: {{dir: {name}.edgebuild}}\n")


def run_edgebuild(work: Path, names: list[str], recipes: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``edgebuild run`` over the recipes (name -> text) in one fresh process: what it did, and its wall time."""
    for name in names:
        (work / f"{name}.yaml").write_text(recipes[name])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgebuild", "run", *(f"{n}.yaml" for n in names), "--json",
                           "--cache-dir", str(work / "store")], cwd=work, capture_output=True, text=True,
                          timeout=WAIT * 2)
    return done, time.perf_counter() - start


def built_variants(stdout: str) -> dict[str, dict]:
    """recipe name -> its variant in ``run --json``'s output (none when the run printed nothing)."""
    try:
        variants = json.loads(stdout)["variants"]
    except (ValueError, KeyError, TypeError):
        return {}
    return {variant["recipe"]: variant for variant in variants}


def edgebuild_result(work: Path, name: str, variant: dict | None, fallback_error: str) -> dict:
    """One recipe's outcome: its package, or why there is none."""
    packages = list((work / f"{name}.edgebuild").glob("*/model.mlpackage"))
    if variant is None or not packages:
        said = (variant or {}).get("error")  # edgebuild's own message: its first line, before the hint
        return {"converts": False, "error": said.strip().splitlines()[0][:160] if said else first_line(fallback_error)}
    stages = {s["name"]: s["seconds"] for s in variant["stages"]}
    work_s = sum(seconds for stage, seconds in stages.items() if stage not in ("resolve", "validate"))
    return {"converts": True, "error": None, "stages_s": stages, "work_s": work_s, "package": str(packages[0])}


def convert_edgebuild(work: Path, name: str, integers: dict) -> dict:
    done, wall = run_edgebuild(work, [name], {name: recipe_text(name, integers)})
    result = edgebuild_result(work, name, built_variants(done.stdout).get(name), done.stderr or done.stdout)
    result["wall_s"] = wall
    if result["converts"]:
        result["seconds"] = wall - result["stages_s"].get("validate", 0.0)
    return result


def peer_case(work: Path, name: str, inputs: list[str], outputs: list[str]) -> dict:
    """One case of the peer's job file: where its module is, where its package goes, the export's names."""
    return {"name": name, "text": str(work / f"{name}.mlir"), "artifact": str(work / f"{name}.stablehlo"),
            "out": str(work / f"{name}.peer.mlpackage"), "inputs": list(inputs), "outputs": list(outputs)}


def peer_results(stdout: str) -> dict[str, dict]:
    """case name -> what the peer's process printed for it (lines that are not its JSON are skipped)."""
    found = {}
    for line in stdout.splitlines():
        try:
            one = json.loads(line)
        except ValueError:
            continue
        if isinstance(one, dict) and "name" in one:
            found[one.pop("name")] = one
    return found


def run_peer(python: Path, work: Path, cases: list[dict], precision: str) -> tuple[dict[str, dict], float]:
    """Every case through the peer, one process for as many as it gets through: a case that takes the
    process down is marked not converted, with the process's last words, and the rest run in another.
    Returns case name -> result, and the wall time of the first process."""
    results: dict[str, dict] = {}
    first_wall = None
    remaining = list(cases)
    while remaining:
        job = work / "peer-job.json"
        job.write_text(json.dumps({"precision": precision, "cases": remaining}))
        start = time.perf_counter()
        done = subprocess.run([str(python), "-c", PEER_CONVERT, str(job)], cwd=work, capture_output=True, text=True,
                              timeout=WAIT * 2)
        first_wall = first_wall if first_wall is not None else time.perf_counter() - start
        printed = peer_results(done.stdout)
        for case in remaining:
            one = printed.get(case["name"])
            if one is None:
                break
            results[case["name"]] = peer_result(one, case)
        left = [case for case in remaining if case["name"] not in results]
        if left:  # the process died on the first case it printed nothing for
            results[left[0]["name"]] = {"converts": False, "error": first_line(done.stderr or done.stdout)}
            left = left[1:]
        remaining = left
    return results, first_wall or 0.0


def peer_result(printed: dict, case: dict) -> dict:
    if not printed.get("converts"):
        return {"converts": False, "error": first_line(printed.get("error") or "")}
    return {"converts": True, "error": None, "work_s": printed["seconds"], "imports_s": printed.get("imports_s"),
            "read_from": printed.get("read_from"), "package": case["out"]}


def convert_peer(python: Path, work: Path, case: dict) -> dict:
    results, wall = run_peer(python, work, [case], "float16")
    result = dict(results[case["name"]], wall_s=wall)
    if result["converts"]:
        result["seconds"] = wall
    return result


# --- numerics: edgebuild verify against the export --------------------------------------------------

def reference_io(reference: Path) -> tuple[dict, list[str]]:
    """The export's input specs ({name: {"shape", "dtype"}}) and output names, as verify's reference reads them."""
    from edgebuild.registry import get_registry

    runner = get_registry().get("frontends", "stablehlo").reference(reference, {}, None, reference.parent)
    return dict(runner.input_specs), list(runner.output_names)


def verify_section(specs: dict, ranges: dict, *, samples: int = 4, thresholds: dict | None = None) -> dict:
    """``verify``'s samples and limits (a ValidateSection's fields): integer inputs uniform over their
    inclusive ``ranges`` (name -> (low, high); -9..9 when not given), floats uniform over theirs,
    else standard normal; booleans a coin toss."""
    inputs = {}
    for index, (name, spec) in enumerate(specs.items()):
        kind = np.dtype(spec["dtype"]).kind
        given = ranges.get(name)
        if kind == "b":
            drawn = {"seed": index}
        elif kind in "iu":
            low, high = given or ((0, 9) if kind == "u" else (-9, 9))
            drawn = {"low": low, "high": high + 1, "seed": index}
        elif given is not None:
            drawn = {"low": given[0], "high": given[1], "seed": index}
        else:
            drawn = {"distribution": "normal", "seed": index}
        inputs[name] = {"random": drawn}
    return {"samples": samples, "inputs": inputs, "thresholds": dict(thresholds or {})}


def lowest_cosine(record: dict) -> float | None:
    """The lowest cosine, over outputs and runtimes, of a verify record (None: no output had one)."""
    found = [values["cosine"]["min"] for runtime in record.get("runtimes", {}).values()
             for values in runtime.get("metrics", {}).values() if "cosine" in values]
    found = [float(value) for value in found if isinstance(value, (int, float))]
    return min(found) if found else None


def verify_package(package: str, reference: Path, section: dict) -> dict:
    """``edgebuild verify PACKAGE --reference REFERENCE`` in this process: the lowest cosine, whether
    every limit held, and what failed (a package the verify refuses or cannot run is a result too)."""
    from edgebuild.cli.verify import verify_artifact
    from edgebuild.recipe.validation import ValidateSection

    try:
        record = verify_artifact(Path(package), reference, ValidateSection.model_validate(section),
                                 base_dir=reference.parent)
    except Exception as exc:  # noqa: BLE001 - a package that cannot be verified is a finding, not a crash
        message = getattr(exc, "message", None) or str(exc)
        return {"cosine": None, "correct": False, "run_error": first_line(f"{type(exc).__name__}: {message}")}
    failures = [first_line(f["message"]) for f in record["failures"]]
    return {"cosine": lowest_cosine(record), "correct": not failures, "failures": failures, "run_error": None}


def measure(name: str, fn, arrays, integers: dict, python: Path, work: Path) -> dict:
    reference = export(fn, arrays, work, name)
    specs, outputs = reference_io(reference)
    section = verify_section(specs, integers)
    row = {"model": name}
    for side, convert in (("edgebuild", lambda: convert_edgebuild(work, name, integers)),
                          ("peer", lambda: convert_peer(python, work, peer_case(work, name, list(specs), outputs)))):
        result = convert()
        if result["converts"]:
            result.update(verify_package(result["package"], reference, section))
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


# --- conformance: the stablehlo suite's cases through both ----------------------------------------

# what "correct" holds every output of a case to, by the dtype the suite judges the case at (its last input's)
CORRECT = {"float16": {"cosine_min": 0.999, "max_rel_max": 5e-2}}
CORRECT_DEFAULT = {"cosine_min": 0.9999, "max_rel_max": 1e-2}
# one sample per case, as the suite's own runs: on a second run edgebuild's MIL interpreter reuses the
# weights a convolution saw first when they are a run-time input (either tool's package), which is the
# interpreter's bug, not a conversion's
CONFORMANCE_SAMPLES = 1
TOOLS = ("edgebuild", "peer")
# float inputs a primitive's domain ends inside the normal draw for, drawn from within the domain instead
DOMAINS = {"lax.log1p": (-0.9, 3.0)}


def conformance_cases(ops: list[str] | None = None) -> list[dict]:
    """The suite's cases (``edgebuild conformance --suite stablehlo``), named as it names them:
    ``{"name", "primitive", "fn", "specs"}`` with specs (shape, dtype[, kind]) per input."""
    from edgebuild_jax.conformance import _variants  # the suite's own generator: the same cases, not a copy

    wanted = {op.removeprefix("lax.") for op in ops} if ops else None
    cases = [{"name": f"lax_{primitive}_{variant}", "primitive": f"lax.{primitive}", "fn": fn, "specs": specs}
             for primitive, variant, fn, specs in _variants() if wanted is None or primitive in wanted]
    if wanted is not None and not cases:
        raise SystemExit(f"no stablehlo conformance cases for: {', '.join(sorted(wanted))}")
    return cases


def case_ranges(names: list[str], specs: list, primitive: str = "") -> dict:
    """Input name -> the range ``verify_section`` draws it from, as the suite draws it: positive kinds
    (indices, divisors, logarithms' arguments) above zero, integers in -9..9 (unsigned 0..9), the floats of
    a primitive in ``DOMAINS`` inside its domain (the suite's normal draws give log1p NaN). A positive
    integer is an index or a divisor: it stays below the smallest dim of the case's other inputs, so
    an index is in range (JAX fills an out-of-range gather with NaN, and a NaN reference proves nothing)."""
    ranges = {}
    for position, (name, spec) in enumerate(zip(names, specs)):
        dtype, kind = np.dtype(spec[1]), (spec[2] if len(spec) > 2 else None)
        if dtype.kind in "iu":
            dims = [d for other, s in enumerate(specs) if other != position for d in s[0]]
            bound = max(1, min([9, *(d - 1 for d in dims)]))
            ranges[name] = (1, bound) if kind == "positive" else (0, 9) if dtype.kind == "u" else (-9, 9)
        elif dtype.kind == "f" and kind == "positive":
            ranges[name] = (0.1, 3.0)
        elif dtype.kind == "f" and primitive in DOMAINS:
            ranges[name] = DOMAINS[primitive]
    return ranges


def case_thresholds(specs: list) -> dict:
    return dict(CORRECT.get(np.dtype(specs[-1][1]).name, CORRECT_DEFAULT))


def judged(converted: dict, verified: dict | None) -> dict:
    """A tool's outcome on one case: converted, and correct only when converted and verified."""
    found = {"converts": bool(converted.get("converts")), "error": converted.get("error")}
    if found["converts"] and verified is not None:
        found.update(verified)
    found["correct"] = bool(found["converts"] and found.get("correct"))
    return found


def share(count: int, total: int) -> str:
    """"yes" when every case of a primitive does it, "no" when none does, else how many."""
    return "yes" if count == total else "no" if count == 0 else f"{count}/{total}"


def summarise(rows: list[dict]) -> list[dict]:
    """Per primitive, in the suite's order: its cases, and how many each tool converts and gets right."""
    found: dict[str, dict] = {}
    for row in rows:
        entry = found.setdefault(row["primitive"], {"primitive": row["primitive"], "cases": 0,
                                                   **{tool: {"converts": 0, "correct": 0} for tool in TOOLS}})
        entry["cases"] += 1
        for tool in TOOLS:
            entry[tool]["converts"] += bool(row[tool]["converts"])
            entry[tool]["correct"] += bool(row[tool]["correct"])
    return list(found.values())


def totals(summary: list[dict]) -> dict:
    """Cases and primitives each tool converts and gets right (a primitive counts when all its cases do)."""
    found = {"cases": sum(e["cases"] for e in summary), "primitives": len(summary)}
    for tool in TOOLS:
        found[tool] = {"cases_converted": sum(e[tool]["converts"] for e in summary),
                       "cases_correct": sum(e[tool]["correct"] for e in summary),
                       "primitives_converted": sum(e[tool]["converts"] == e["cases"] for e in summary),
                       "primitives_correct": sum(e[tool]["correct"] == e["cases"] for e in summary)}
    return found


def conformance_table(summary: list[dict], total: dict) -> str:
    heads = ["primitive", "cases", "edgebuild converts", "correct", "peer converts", "correct"]
    body = [[e["primitive"], str(e["cases"]), *(share(e[tool][key], e["cases"]) for tool in TOOLS
                                                for key in ("converts", "correct"))] for e in summary]
    body.append(["total", str(total["cases"]), *(f"{total[tool][key]}/{total['cases']}" for tool in TOOLS
                                                 for key in ("cases_converted", "cases_correct"))])
    body.append(["primitives, all cases", str(total["primitives"]),
                 *(f"{total[tool][key]}/{total['primitives']}" for tool in TOOLS
                   for key in ("primitives_converted", "primitives_correct"))])
    widths = [max(len(r[i]) for r in [heads, *body]) for i in range(len(heads))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [heads, *body]]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 2, "-" * len(lines[0]))
    return "\n".join(lines)


def why_not(rows: list[dict]) -> list[str]:
    """One line per case a tool does not convert or get right, saying why."""
    lines = []
    for row in rows:
        for tool in TOOLS:
            result = row[tool]
            if result["correct"]:
                continue
            reason = (f"not converted: {result.get('error')}" if not result["converts"] else
                      f"cannot verify: {result['run_error']}" if result.get("run_error") else
                      "wrong: " + "; ".join(result.get("failures") or ["no output compared"]))
            lines.append(f"{row['case']}  {tool}  {reason}"[:220])
    return lines


def run_conformance(python: Path, work: Path, ops: list[str] | None) -> dict:
    cases = conformance_cases(ops)
    prepared = []
    for case in cases:
        arrays = [np.zeros(spec[0], spec[1]) for spec in case["specs"]]
        reference = export(case["fn"], arrays, work, case["name"])
        specs, outputs = reference_io(reference)
        prepared.append((case, reference, list(specs), outputs,
                         verify_section(specs, case_ranges(list(specs), case["specs"], case["primitive"]),
                                        samples=CONFORMANCE_SAMPLES, thresholds=case_thresholds(case["specs"]))))
    names = [case["name"] for case in cases]
    print(f"{len(cases)} cases: edgebuild converts them", file=sys.stderr)
    done, _ = run_edgebuild(work, names, {n: recipe_text(n, precision="float32", validate=False) for n in names})
    variants = built_variants(done.stdout)
    print("the peer converts them", file=sys.stderr)
    peer, _ = run_peer(python, work, [peer_case(work, c["name"], i, o) for c, _, i, o, _ in prepared], "float32")
    rows = []
    for case, reference, _, _, section in prepared:
        row = {"case": case["name"], "primitive": case["primitive"]}
        converted = {"edgebuild": edgebuild_result(work, case["name"], variants.get(case["name"]),
                                                   done.stderr or "no result"),
                     "peer": peer[case["name"]]}
        for tool in TOOLS:
            result = converted[tool]
            verified = verify_package(result["package"], reference, section) if result["converts"] else None
            row[tool] = judged(result, verified)
        print(f"{case['name']}: " + "  ".join(f"{t} {'ok' if row[t]['correct'] else 'no'}" for t in TOOLS),
              file=sys.stderr)
        rows.append(row)
    summary = summarise(rows)
    return {"cases": rows, "primitives": summary, "totals": totals(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--conformance", action="store_true",
                        help="every case of the stablehlo conformance suite through both, instead of the models")
    parser.add_argument("--ops", help="with --conformance: only these primitives (comma-separated, e.g. add,sort)")
    parser.add_argument("--venv", type=Path, default=ROOT / "build" / "peer-venvs" / "stablehlo-coreml-0.0.18")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.conformance:
        python = peer_venv(args.venv.resolve())
        with tempfile.TemporaryDirectory() as scratch:
            found = run_conformance(python, Path(scratch), args.ops.split(",") if args.ops else None)
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            print(conformance_table(found["primitives"], found["totals"]))
            print("\n".join(["", *why_not(found["cases"])]))
        return
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
