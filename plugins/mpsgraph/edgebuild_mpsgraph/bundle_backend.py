"""The ``bundle`` backend: partition -> lower each segment -> package (manifest).

A model the first preferred backend runs whole stays one Core ML segment, and the artifact
holds just ``model.mlpackage`` (no manifest); otherwise ``bundle/`` holds ``manifest.json``
and ``segments/``. The core validates the artifact with the runner :meth:`BundleBackend.candidates`
gives: an inference session running each segment on its runtime.

Each stage is typed parameters built once from the recipe (:meth:`BundleBackend.stages`) and a
module-level body reading only them, its upstream results and the registry kinds it ``uses``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir

from edgebuild.plugin import Backend, Candidate, Stage, StageInputs, StageParams, edgebuild_version, standard_domain
from edgebuild.plugin.graph import load_stage_model
from edgebuild.plugin.store import MLPACKAGE
from edgebuild_mpsgraph.options import BundleOptions, preference

ARTIFACT = "bundle"
WHOLE_MODEL = "model.mlpackage"  # the artifact instead when Core ML runs the whole model
CANDIDATE = "bundle"  # the name validation reports the bundle's runner by


def kernel_ops(registry) -> dict:
    """Custom ops whose declaration carries a Metal kernel (an ``entry`` and a ``source``)."""
    return {key: e.obj for key, e in registry.tables["custom_ops"].items()
            if getattr(e.obj, "entry", None) and getattr(e.obj, "source", None)}


def backend_supports(name: str, model: ir.Model, registry):
    if name == "mpsgraph":
        from edgebuild_mpsgraph.lowering import supports

        return lambda node: supports(node, model, registry)
    opsets = {standard_domain(d): v for d, v in model.opset_imports.items()}

    def supports_node(node) -> bool:
        domain = standard_domain(node.domain)
        return (domain, node.op_type) == ("", "Constant") or \
            registry.lowering(name, node.op_type, domain, opsets.get(domain, 1)) is not None

    return supports_node


def type_kernel_outputs(model: ir.Model, kernels: dict) -> None:
    """Give custom-op outputs the dtype and shape their kernel declares (onnx cannot infer them)."""
    for node in model.graph:
        spec = kernels.get((node.domain, node.op_type))
        if spec is None:
            continue
        shapes = {d.name: tuple(v.shape) for d, v in zip(spec.inputs, node.inputs) if v is not None and v.shape is not None}
        attrs = spec.attrs_with_defaults({k: a.value for k, a in node.attributes.items() if k in spec.attributes})
        out_shapes = spec.output_shapes_for(shapes, attrs)
        for decl, value in zip(spec.outputs, node.outputs):
            value.dtype = ir.DataType.from_numpy(decl.numpy_dtype)
            value.shape = ir.Shape([int(d) for d in out_shapes[decl.name]])


def load_model(path: Path, registry) -> tuple[ir.Model, dict]:
    model = load_stage_model(path)  # its data file may link the import stage's
    ir.external_data.load_to_model(model)
    kernels = kernel_ops(registry)
    type_kernel_outputs(model, kernels)
    return model, kernels


def plan_segments(model: ir.Model, kernels: dict, registry, params: "PartitionParams"):
    from edgebuild.plugin.graph import partition
    from edgebuild_mpsgraph.segments import KERNEL_BACKEND

    backends = [(name, backend_supports(name, model, registry)) for name in params.prefer]
    return partition(model, backends, kernels, kernel_backend=KERNEL_BACKEND,
                     min_segment_ops=params.min_segment_ops, min_segment_flops=params.min_segment_flops)


def graph_borders(model: ir.Model, specs: list[dict]) -> dict:
    """The bundle's inputs and outputs, as the segments that read or write them saw them
    (a lowered segment knows exact shapes where the ONNX graph kept a symbolic dim)."""
    seen: dict[str, dict] = {}
    for spec in specs:
        for tensor in (*spec["inputs"], *spec["outputs"]):
            seen.setdefault(tensor["name"], tensor)
    initializers = set(model.graph.initializers)

    def border(value):
        known = seen.get(value.name)
        if known is None:
            from edgebuild_mpsgraph.segments import tensor_spec

            return tensor_spec(value).model_dump(mode="json")
        dtype = value.dtype and np.dtype(value.dtype.numpy()).name
        return {**known, "binding": None, "dtype": dtype or known["dtype"]}

    return {"inputs": [border(v) for v in model.graph.inputs if v.name not in initializers],
            "outputs": [border(v) for v in model.graph.outputs]}


def segment_renamings(specs: list[dict]) -> list[dict]:
    """Every border tensor a segment's artifact names differently (its manifest ``binding``), for the report."""
    return [{"tensor": role, "onnx": tensor["name"], "artifact": tensor["binding"], "segment": spec["index"],
             "reason": f"{spec['backend']} does not accept the name"}
            for spec in specs for role in ("input", "output") for tensor in spec[role + "s"] if tensor.get("binding")]


class PartitionParams(StageParams):
    """Which backends may take a segment, best first, and when a segment is too small to stand alone."""

    prefer: tuple[str, ...]
    min_segment_ops: int
    min_segment_flops: float


class LowerParams(StageParams):
    """What a Core ML segment is lowered for (``Backend.lower_segment``'s ``params``)."""

    deployment_target: str
    precision: str
    policy: str


class PackageParams(StageParams):
    """What the manifest says besides the segments: names, the compute policy and the producing versions."""

    name: str
    variant: str
    compute_policy: str
    versions: dict[str, str]


def partition_body(params: PartitionParams, inputs: StageInputs, out: Path) -> dict:
    model, kernels = load_model(inputs.path("optimize") / "model.onnx", inputs.registry)
    segments = plan_segments(model, kernels, inputs.registry, params)
    order = {id(n): i for i, n in enumerate(model.graph)}
    record = [{"backend": s.backend, "nodes": [order[id(n)] for n in s.nodes], "inputs": s.inputs,
               "outputs": s.outputs, "flops": s.flops, "ops": s.op_types()} for s in segments]
    (out / "partition.json").write_text(json.dumps(record, indent=1))
    return {"segments": [{k: v for k, v in s.items() if k != "nodes"} for s in record]}


def lower_body(params: LowerParams, inputs: StageInputs, out: Path) -> dict:
    from edgebuild.plugin.graph import Segment
    from edgebuild_mpsgraph.segments import lower_segment

    model, _ = load_model(inputs.path("optimize") / "model.onnx", inputs.registry)
    model.graph.sort()
    nodes = list(model.graph)
    record = json.loads((inputs.path("partition") / "partition.json").read_text())
    segments = [Segment(s["backend"], [nodes[i] for i in s["nodes"]], s["inputs"], s["outputs"], s["flops"])
                for s in record]
    specs = [lower_segment(model, s, i, out, params=params.key_params(), registry=inputs.registry).model_dump(mode="json")
             for i, s in enumerate(segments)]
    return {"segments": specs, **graph_borders(model, specs), "renamings": segment_renamings(specs)}


def package_body(params: PackageParams, inputs: StageInputs, out: Path) -> dict:
    """Write ``out/bundle`` (manifest + segments), or ``out/model.mlpackage`` when Core ML runs the
    whole model; ``info["artifact"]`` names which."""
    from edgebuild.plugin.bundle import HandOffSpec, Manifest, write_manifest
    from edgebuild.plugin.graph import HandOff

    lowered = inputs.results["lower"]
    info = lowered.info
    segments = info["segments"]
    if len(segments) == 1 and segments[0]["backend"] == "coreml":  # a plain Core ML model
        shutil.copytree(lowered.path / segments[0]["files"]["model"], out / WHOLE_MODEL)
        return {"kind": "mlpackage", "segments": 1, "artifact": WHOLE_MODEL}
    bundle_dir = out / ARTIFACT
    bundle_dir.mkdir(parents=True)
    shutil.copytree(lowered.path / "segments", bundle_dir / "segments")
    producer = {o["name"]: s["index"] for s in segments for o in s["outputs"]}
    graph_inputs = {t["name"] for t in info["inputs"]}
    edges = [HandOff(t["name"], None if t["name"] in graph_inputs else producer.get(t["name"]), s["index"])
             for s in segments for t in s["inputs"]]
    edges += [HandOff(t["name"], producer.get(t["name"]), None) for t in info["outputs"]]
    manifest = Manifest(name=params.name, variant=params.variant, compute_policy=params.compute_policy,
                        inputs=info["inputs"], outputs=info["outputs"], segments=segments,
                        handoffs=[HandOffSpec(tensor=e.tensor, from_segment=e.producer, to_segment=e.consumer)
                                  for e in edges],
                        versions=params.versions)
    write_manifest(manifest, bundle_dir)
    return {"kind": "bundle", "segments": len(segments), "artifact": ARTIFACT,
            "backends": [s["backend"] for s in segments],
            "size_bytes": sum(f.stat().st_size for f in bundle_dir.rglob("*") if f.is_file())}


# What decides each stage's output besides its parameters and inputs: the registry kinds its body
# calls (their plugins join the key) and the libraries that lower or judge it.
ONNX_LIBRARIES = ("onnx", "onnx-ir", "numpy")
SEGMENT_LIBRARIES = ("coremltools", "edgebuild-msl")  # Core ML segments; Metal kernels' dispatch and source


class BundleBackend(Backend):
    name = "bundle"
    artifact = ARTIFACT
    # one candidate: the bundle as its inference session runs it, each segment on its own runtime
    validation_runtimes = (CANDIDATE,)
    validation_libraries = SEGMENT_LIBRARIES

    def stages(self, variant, registry) -> list[Stage]:
        recipe = variant.recipe
        options = variant.section("bundle:target.options") or BundleOptions()
        plugin = registry.plugin_of("backends", self.name)
        versions = {"edgebuild": edgebuild_version(),
                    **({plugin.distribution or plugin.name: plugin.version} if plugin else {})}
        partition = PartitionParams(prefer=preference(options, recipe.compute.policy),
                                    min_segment_ops=options.min_segment_ops,
                                    min_segment_flops=options.min_segment_flops)
        lower = LowerParams(deployment_target=recipe.target.deployment_target, precision=recipe.target.precision,
                            policy=recipe.compute.policy)
        package = PackageParams(name=recipe.name, variant=variant.name, compute_policy=recipe.compute.policy,
                                versions=versions)
        return [
            # each stage's files (the store's layouts): a remote entry holding others is refused
            Stage("partition", partition, ["optimize"], partition_body, uses=("lowerings", "custom_ops"),
                  libraries=ONNX_LIBRARIES, extra={"layout": ("partition.json",)}),
            # Core ML segments go through coremltools' MIL builder, which keeps global state: take turns
            Stage("lower", lower, ["optimize", "partition"], lower_body,
                  uses=("lowerings", "custom_ops", "backends"), libraries=(*ONNX_LIBRARIES, *SEGMENT_LIBRARIES),
                  extra={"layout": ("segments/**",), "exclusive": "coremltools"}),
            # its body is this backend's own code: its plugin's version joins the key
            Stage("package", package, ["lower"], package_body, uses=("backends",),
                  extra={"artifact": ARTIFACT, "layout": (f"{ARTIFACT}/**", *MLPACKAGE)}),
        ]

    def candidates(self, artifact: Path, runtimes, *, precision: str, emulate_fp16: bool, built, registry) -> dict:
        """One candidate, ``bundle``: an inference session running each segment on the runtime that
        runs it on any OS (the numpy MPSGraph executor, Metal kernels emulated, Core ML's interpreter)."""
        from edgebuild.plugin.bundle import InferenceSession

        artifact = Path(artifact)
        if not artifact.exists() and (artifact.parent / WHOLE_MODEL).exists():
            artifact = artifact.parent / WHOLE_MODEL  # the package stage made a plain Core ML model
        session = InferenceSession(artifact, registry=registry, native=False)
        return {CANDIDATE: Candidate(session.run)}
