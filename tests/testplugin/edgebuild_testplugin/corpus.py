"""The corpus of public architectures: each one exported as a user would, built by edgebuild, and
converted by coremltools beside it.

An :class:`Entry` names a model and how to make it: ``make()`` returns a :class:`Made` (the module
in eval mode with random weights, example inputs, input names). The steps:

- :func:`export`: ``torch.onnx.export`` at opset 18, the dynamo exporter first, then
  ``dynamo=False`` as a user would retry; which one worked is recorded (:class:`Exported`);
- :func:`onnxruntime_runs`: the exported file runs in onnxruntime on the example inputs;
- :func:`build`: a recipe on the exported file (inputs pinned to the example shapes, fp32 or fp16,
  the thresholds ``edgebuild init`` writes) run by ``edgebuild run --json`` in a subprocess;
- :func:`coremltools_convert`: ``ct.convert`` of ``torch.jit.trace`` of the same module, its package
  checked by ``edgebuild verify`` against the same ONNX file.

A model whose export fails, or that onnxruntime cannot run, raises :class:`Excluded`: the corpus
records it and leaves it out; every later failure is edgebuild's (or coremltools') to answer for.

torch, torchvision and transformers are imported inside the functions: the core's tests import
this package without them. Exported files are cached by the entry's name and the source of its
``make`` (``EDGEBUILD_CORPUS_CACHE``, default a temporary folder per process); weights are seeded.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

OPSET = 18
SEED = 0
SAMPLES = 2
# the thresholds edgebuild init and edgebuild convert write (edgebuild.start.init)
COSINE_MIN = {"float32": 0.9999, "float16": 0.999}
PRECISIONS = {"fp32": "float32", "fp16": "float16"}
BUILD_TIMEOUT = 3600
HARNESS = 3  # in the export cache key: what made() does to a module before export
CALIBRATION_VALUES = 1024  # per channel, that each batch norm's statistics average over
CALIBRATION_PASSES = (4, 128)  # the fewest and most calibration passes


class Made(NamedTuple):
    """What an entry's ``make()`` returns."""

    module: Any  # torch.nn.Module, in eval mode
    inputs: Any  # a tuple of tensors (positional) or a dict (keyword arguments)
    input_names: tuple[str, ...]
    # recipe ``validate.inputs`` sources by input name (e.g. tokens with a vocab size); others: uniform [0, 1)
    validate_inputs: Optional[dict] = None
    # a detector's outputs: compared by IoU matching (validate.detections), see :class:`Detector`
    detector: Optional["Detector"] = None


class Detector(NamedTuple):
    """What a detector returns and where it cuts: its outputs' keys in the exported order, and the
    score threshold, NMS IoU and cap on detections its postprocessing applies."""

    keys: tuple[str, ...]  # e.g. ("boxes", "labels", "scores"): torchvision's dict keys, as exported
    score_threshold: float
    nms_iou: float
    max_detections: int


@dataclass(frozen=True)
class Entry:
    family: str  # e.g. "classification", "detection", "text-encoder"
    name: str  # unique across the corpus
    make: Callable[[], Made] = field(compare=False, repr=False)
    ci: bool = False  # in the representative share that runs by default

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


class Excluded(Exception):
    """The model cannot enter the corpus: its export fails, or onnxruntime cannot run the file."""

    def __init__(self, step: str, reason: str):
        super().__init__(f"{step}: {reason}")
        self.step = step  # "export" | "onnxruntime"
        self.reason = reason


@dataclass
class Exported:
    path: Path  # the ONNX file
    exporter: str  # "dynamo" | "torchscript"
    input_names: tuple[str, ...]  # the graph's inputs, in order
    shapes: dict  # input name -> [dims], the example's
    dtypes: dict  # input name -> numpy dtype name
    seconds: float
    dynamo_error: str = ""  # the first line of the dynamo exporter's failure, when it was retried


@dataclass
class Built:
    precision: str
    built: bool
    validated: bool
    cosine: Optional[float]  # the worst output's worst sample
    error: str  # first line, "" when built and validated
    seconds: float
    boxes: Optional[Boxes] = None  # a detector's box matching


@dataclass
class Boxes:
    """A detector's box matching in a build's validation, the worst over outputs, samples and runtimes."""

    match: Optional[float]  # box_match
    iou: Optional[float]  # box_iou
    score_diff: Optional[float]  # box_score_diff (the highest)


@dataclass
class Converted:
    converted: bool
    cosine: Optional[float]
    error: str
    seconds: float


def first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def cache_dir() -> Path:
    global _CACHE
    configured = os.environ.get("EDGEBUILD_CORPUS_CACHE")
    if configured:
        path = Path(configured)
    else:
        if _CACHE is None:
            _CACHE = Path(tempfile.mkdtemp(prefix="edgebuild-corpus-"))
        path = _CACHE
    path.mkdir(parents=True, exist_ok=True)
    return path


_CACHE: Optional[Path] = None
_MADE: dict[str, Made] = {}


def _code_digest(code) -> str:
    """What a function does (bytecode, names, constants; nested functions too), not where its lines sit."""
    parts = [code.co_code.hex(), repr(code.co_names)]
    parts += [_code_digest(const) if hasattr(const, "co_code") else repr(const) for const in code.co_consts]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _key(entry: Entry) -> str:
    """The entry's name, what its make() does and the values it closes over, so an edited entry exports afresh."""
    import torch

    make = entry.make
    code = _code_digest(make.__code__) if hasattr(make, "__code__") else repr(make)
    cells = repr([cell.cell_contents for cell in getattr(make, "__closure__", None) or ()])
    text = f"{entry.id}\n{torch.__version__}\n{HARNESS}\n{code}\n{cells}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{entry.family}-{entry.name}-{digest}".replace("/", "_")


def made(entry: Entry) -> Made:
    """``entry.make()`` with seeded weights and batch norms calibrated, once per process."""
    if entry.id not in _MADE:
        import torch

        torch.manual_seed(SEED)
        result = entry.make()
        calibrate_batch_norms(result)
        result.module.eval()
        _MADE[entry.id] = result
    return _MADE[entry.id]


def calibrate_batch_norms(example: Made, passes: tuple[int, int] = CALIBRATION_PASSES) -> None:
    """Give every batch norm the statistics of its input on random examples, as training would.

    With random weights and the default statistics (mean 0, variance 1), activations shrink layer
    by layer (torchvision's depthwise convolutions are initialised for a fan-in C times too large):
    MobileNet's logits end near 1e-10, below fp16's smallest number, which no trained model does.
    Each norm averages its input's per-channel mean and variance over the passes just before it
    normalises, so the layers after it see calibrated inputs in the same pass; a norm seeing one
    value per channel (batch 1 at 1x1) keeps its defaults. Passes go on (between ``passes``' bounds)
    until every other norm has seen CALIBRATION_VALUES values per channel: a deep norm of a small
    image sees a 2x2 map, and four passes' 16 values leave its variance off by tens of percent,
    which compounds over the blocks after it (EfficientNet-B0's logits reached 900).
    """
    import torch

    norms = [m for m in example.module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    seen, values = {}, {}

    def update(norm, inputs):
        x = inputs[0]
        if x.numel() <= x.shape[1]:
            return
        dims = [d for d in range(x.dim()) if d != 1]
        count = seen[norm] = seen.get(norm, 0) + 1
        values[norm] = values.get(norm, 0) + x.numel() // x.shape[1]
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        norm.running_mean += (mean - norm.running_mean) / count if count > 1 else mean - norm.running_mean
        norm.running_var += (var - norm.running_var) / count if count > 1 else var - norm.running_var

    hooks = [norm.register_forward_pre_hook(update) for norm in norms]
    example.module.eval()
    args, kwargs = _as_args(example.inputs)
    fresh = lambda value: torch.rand_like(value) if torch.is_tensor(value) and value.is_floating_point() else value  # noqa: E731
    try:
        with torch.no_grad():
            fewest, most = passes
            for done in range(1, most + 1):
                example.module(*map(fresh, args), **{name: fresh(value) for name, value in kwargs.items()})
                if done >= fewest and all(count >= CALIBRATION_VALUES for count in values.values()):
                    break
    finally:
        for hook in hooks:
            hook.remove()


def _as_args(inputs) -> tuple[tuple, dict]:
    return ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})


def _example_arrays(example: Made, names: tuple[str, ...]) -> dict:
    """The example inputs as numpy arrays, by the ONNX graph's input names."""
    args, kwargs = _as_args(example.inputs)
    tensors = list(args) + list(kwargs.values())
    by_name = dict(zip(example.input_names, tensors))
    if set(names) <= set(by_name):
        return {name: by_name[name].detach().numpy() for name in names}
    return {name: tensor.detach().numpy() for name, tensor in zip(names, tensors)}


def _torch_export(module, args, kwargs, path: Path, names, dynamo: bool) -> None:
    import warnings

    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        options = dict(input_names=list(names), opset_version=OPSET, dynamo=dynamo)
        if dynamo:
            options.update(external_data=False, verbose=False)
        torch.onnx.export(module, args, str(path), kwargs=kwargs or None, **options)


def export(entry: Entry) -> Exported:
    """The entry's ONNX file (cached); raises :class:`Excluded` when neither exporter manages it."""
    import onnx

    key = _key(entry)
    path = cache_dir() / f"{key}.onnx"
    record = cache_dir() / f"{key}.json"
    if record.exists():
        facts = json.loads(record.read_text())
        if "excluded" in facts:
            raise Excluded("export", facts["excluded"])
        if path.exists():
            return Exported(path=path, **{k: tuple(v) if k == "input_names" else v for k, v in facts.items()})
    example = made(entry)
    args, kwargs = _as_args(example.inputs)
    started = time.perf_counter()
    exporter, dynamo_error = "dynamo", ""
    partial = path.with_suffix(f".{os.getpid()}.onnx")
    try:
        _torch_export(example.module, args, kwargs, partial, example.input_names, dynamo=True)
    except Exception as error:  # what a user sees, then retries with the TorchScript exporter
        dynamo_error = first_line(f"{type(error).__name__}: {error}")
        exporter = "torchscript"
        try:
            _torch_export(example.module, args, kwargs, partial, example.input_names, dynamo=False)
        except Exception as retry:
            reason = f"dynamo: {dynamo_error}; torchscript: {first_line(f'{type(retry).__name__}: {retry}')}"
            record.write_text(json.dumps({"excluded": reason}))
            raise Excluded("export", reason) from None
    seconds = time.perf_counter() - started
    proto = onnx.load(str(partial), load_external_data=False)
    initializers = {init.name for init in proto.graph.initializer}
    names = tuple(i.name for i in proto.graph.input if i.name not in initializers)
    arrays = _example_arrays(example, names)
    os.replace(partial, path)
    facts = dict(exporter=exporter, input_names=names, shapes={n: list(a.shape) for n, a in arrays.items()},
                 dtypes={n: a.dtype.name for n, a in arrays.items()}, seconds=seconds, dynamo_error=dynamo_error)
    record.write_text(json.dumps(facts))
    return Exported(path=path, **facts)


def onnxruntime_runs(exported: Exported, entry: Entry) -> list:
    """The outputs of onnxruntime on the example inputs; raises :class:`Excluded` when it cannot run them."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
        return session.run(None, _example_arrays(made(entry), exported.input_names))
    except Exception as error:
        raise Excluded("onnxruntime", first_line(f"{type(error).__name__}: {error}")) from None


def _validate_inputs(exported: Exported, example: Made) -> dict:
    given = dict(example.validate_inputs or {})
    sources = {}
    for name in exported.input_names:
        if name in given:
            sources[name] = given[name]
        elif exported.dtypes[name].startswith("float"):
            sources[name] = {"random": {"low": 0.0, "high": 1.0, "seed": SEED}}
        else:
            raise ValueError(f"corpus entry: input {name!r} ({exported.dtypes[name]}) needs a validate_inputs source")
    return sources


# A detector's boxes: all matched at fp32, where only borderline boxes may flip; nine in ten at fp16
BOX_MATCH_MIN = {"float32": 0.99, "float16": 0.9}
BOX_IOU_MIN = {"float32": 0.999, "float16": 0.99}
# How far a score or an overlap moves at each precision, about: the borderline margins
SCORE_MARGIN = {"float32": 1e-4, "float16": 1e-2}
NMS_MARGIN = {"float32": 1e-3, "float16": 1e-2}


def detections_section(exported: Exported, detector: Detector, target_precision: str) -> dict:
    """``validate.detections`` and the box limits for a detector's exported outputs."""
    names = dict(zip(detector.keys, _output_names(exported)))
    group = {"boxes": names["boxes"], "scores": names["scores"], "labels": names["labels"],
             "attached": [names[key] for key in detector.keys if key not in ("boxes", "scores", "labels")],
             "score_threshold": detector.score_threshold, "nms_iou": detector.nms_iou,
             "max_detections": detector.max_detections, "score_margin": SCORE_MARGIN[target_precision],
             "nms_margin": NMS_MARGIN[target_precision]}
    return {"detections": [group], "thresholds": {"box_match_min": BOX_MATCH_MIN[target_precision],
                                                  "box_iou_min": BOX_IOU_MIN[target_precision]}}


def recipe(exported: Exported, entry: Entry, precision: str) -> dict:
    """The recipe a user would write for the exported file: inputs pinned, one variant."""
    target_precision = PRECISIONS[precision]
    digest = hashlib.sha256(exported.path.read_bytes()).hexdigest()
    detector = made(entry).detector
    detection = detections_section(exported, detector, target_precision) if detector else {}
    return {
        "edgebuild": 1,
        "name": entry.name.replace("/", "_"),
        "source": {"model": str(exported.path), "sha256": digest,
                   "inputs": {name: {"shape": exported.shapes[name], "dtype": exported.dtypes[name]}
                              for name in exported.input_names}},
        "target": {"backend": "coreml", "deployment_target": "iOS17", "precision": target_precision},
        "compute": {"policy": "cpu_and_gpu" if precision == "fp32" else "cpu_and_ne"},
        "validate": {"samples": SAMPLES, "inputs": _validate_inputs(exported, made(entry)),
                     "thresholds": {"cosine_min": COSINE_MIN[target_precision], **detection.get("thresholds", {})},
                     **({"detections": detection["detections"]} if detection else {})},
        "outputs": {"dir": "out"},
    }


def _edgebuild(*args, cwd: Path, timeout: int = BUILD_TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "edgebuild.cli.app", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


def _worst_cosine(validation: dict) -> Optional[float]:
    cosines = [values["cosine"]["min"] for runtime in (validation or {}).get("runtimes", {}).values()
               for values in runtime.get("metrics", {}).values() if values.get("cosine", {}).get("min") is not None]
    return min(cosines) if cosines else None


def _worst_boxes(validation: dict) -> Optional[Boxes]:
    found = {"box_match": [], "box_iou": [], "box_score_diff": []}
    for runtime in (validation or {}).get("runtimes", {}).values():
        for values in runtime.get("metrics", {}).values():
            for metric, seen in found.items():
                side = "max" if metric == "box_score_diff" else "min"
                if values.get(metric, {}).get(side) is not None:
                    seen.append(float(values[metric][side]))
    if not found["box_match"]:
        return None
    return Boxes(min(found["box_match"]), min(found["box_iou"], default=None), max(found["box_score_diff"], default=None))


def _error_line(record: dict, stderr: str) -> str:
    if record.get("error"):
        return first_line(record["error"])
    failures = (record.get("validation") or {}).get("failures") or []
    if failures:
        failure = failures[0]
        return first_line(failure.get("message") or f"{failure.get('output')}: {failure.get('metric')} "
                          f"{failure.get('value')} (limit {failure.get('limit')})")
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    return first_line(errors[-1] if errors else stderr[-300:])


def build(exported: Exported, entry: Entry, workdir: Path, precision: str, cache: Optional[Path] = None) -> Built:
    """``edgebuild run --json`` on :func:`recipe` in ``workdir`` (its own cache dir unless given)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{precision}.yaml"
    path.write_text(json.dumps(recipe(exported, entry, precision), indent=1) + "\n")  # JSON is YAML
    started = time.perf_counter()
    try:
        done = _edgebuild("run", path, "--cache-dir", cache or workdir / "cache", "--json", cwd=workdir)
    except subprocess.TimeoutExpired as expired:  # a row like any failed build's: the run goes on
        return Built(precision, False, False, None, f"timed out after {expired.timeout:.0f} s",
                     time.perf_counter() - started)
    seconds = time.perf_counter() - started
    try:
        [record] = json.loads(done.stdout)["variants"]
    except (ValueError, KeyError):
        return Built(precision, False, False, None, _error_line({}, done.stderr), seconds)
    validation = record.get("validation") or {}
    cosine = _worst_cosine(validation)
    built = bool(record.get("artifacts")) or record.get("status") == "built"
    validated = record.get("status") == "built" and cosine is not None
    return Built(precision, built, validated, cosine, "" if validated else _error_line(record, done.stderr), seconds,
                 _worst_boxes(validation))


def coremltools_convert(entry: Entry, exported: Exported, workdir: Path) -> Converted:
    """``ct.convert`` of ``torch.jit.trace`` of the module (fp32 ML program, the ONNX file's input
    names), then ``edgebuild verify`` of the package against the ONNX file on the inputs the
    edgebuild build validates on."""
    import warnings

    import torch

    workdir.mkdir(parents=True, exist_ok=True)
    example = made(entry)
    args, kwargs = _as_args(example.inputs)
    started = time.perf_counter()
    try:
        import coremltools as ct

        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(example.module, args if not kwargs else (), example_kwarg_inputs=kwargs or None,
                                     strict=False)
            arrays = _example_arrays(example, exported.input_names)
            inputs = [ct.TensorType(name=name, shape=array.shape, dtype=array.dtype.type)
                      for name, array in arrays.items()]
            outputs = [ct.TensorType(name=name) for name in _output_names(exported)]  # verify matches by name
            mlmodel = ct.convert(traced, inputs=inputs, outputs=outputs, convert_to="mlprogram", compute_precision=ct.precision.FLOAT32,
                                 minimum_deployment_target=ct.target.iOS17)
        package = workdir / "coremltools.mlpackage"
        mlmodel.save(str(package))
    except Exception as error:
        return Converted(False, None, first_line(f"{type(error).__name__}: {error}")
                         or first_line(traceback.format_exc()), time.perf_counter() - started)
    seconds = time.perf_counter() - started
    sources = workdir / "inputs.yaml"  # the same input sources the edgebuild build validates on
    sources.write_text(json.dumps(_validate_inputs(exported, example), indent=1) + "\n")  # JSON is YAML
    done = _edgebuild("verify", package, "--reference", exported.path, "--samples", SAMPLES, "--inputs", sources,
                      "--json", cwd=workdir)
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        return Converted(True, None, "verify: " + first_line(done.stderr[-2000:]), seconds)
    cosine = _worst_cosine(answer)
    if cosine is None:
        return Converted(True, None, "verify: " + first_line((answer.get("error") or {}).get("message", "no cosine")),
                         seconds)
    return Converted(True, cosine, "", seconds)


def _output_names(exported: Exported) -> list[str]:
    import onnx

    return [output.name for output in onnx.load(str(exported.path), load_external_data=False).graph.output]


__all__ = ["COSINE_MIN", "PRECISIONS", "Boxes", "Built", "Converted", "Detector", "Entry", "Excluded", "Exported", "Made", "build",
           "coremltools_convert", "export", "first_line", "made", "onnxruntime_runs", "recipe"]
