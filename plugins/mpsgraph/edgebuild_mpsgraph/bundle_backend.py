"""The ``bundle`` backend: partition -> lower each segment -> package (manifest) -> validate.

A model the first preferred backend runs whole stays one Core ML segment, and the artifact
holds just ``model.mlpackage`` (no manifest); otherwise ``bundle/`` holds ``manifest.json``
and ``segments/``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx_ir as ir

from edgebuild.dag.stages import Stage
from edgebuild.graph.weight_files import load_stage_model
from edgebuild.protocols import Backend
from edgebuild.store.layout import MLPACKAGE, VALIDATION
from edgebuild_mpsgraph.options import BundleOptions, preference

ARTIFACT = "bundle"


def kernel_ops(registry) -> dict:
    """Custom ops whose declaration carries a Metal kernel (an ``entry`` and a ``source``)."""
    return {key: e.obj for key, e in registry.tables["custom_ops"].items()
            if getattr(e.obj, "entry", None) and getattr(e.obj, "source", None)}


def backend_supports(name: str, model: ir.Model, registry):
    if name == "mpsgraph":
        from edgebuild_mpsgraph.lowering import supports

        return lambda node: supports(node, model, registry)
    from edgebuild.graph.partition import STANDARD_DOMAINS

    opsets = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}

    def supports_node(node) -> bool:
        domain = "" if node.domain in STANDARD_DOMAINS else node.domain
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


def plan_segments(model: ir.Model, kernels: dict, registry, params: dict):
    from edgebuild.graph.partition import partition
    from edgebuild_mpsgraph.segments import KERNEL_BACKEND

    backends = [(name, backend_supports(name, model, registry)) for name in params["prefer"]]
    return partition(model, backends, kernels, kernel_backend=KERNEL_BACKEND,
                     min_segment_ops=params["min_segment_ops"], min_segment_flops=params["min_segment_flops"])


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


class BundleBackend(Backend):
    name = "bundle"
    artifact = ARTIFACT

    def stages(self, variant, registry, plugins: dict[str, str]) -> list[Stage]:
        recipe = variant.recipe
        dump = variant.params
        options = variant.section("bundle:target.options") or BundleOptions()
        partition_params = {"prefer": preference(options, recipe.compute.policy),
                            "min_segment_ops": options.min_segment_ops,
                            "min_segment_flops": options.min_segment_flops}
        lower_params = {**partition_params, "deployment_target": recipe.target.deployment_target,
                        "precision": recipe.target.precision, "policy": recipe.compute.policy,
                        "inputs": dump["source"]["inputs"]}

        def partition_stage(results, out: Path) -> dict:
            model, kernels = load_model(results["optimize"].path / "model.onnx", registry)
            segments = plan_segments(model, kernels, registry, partition_params)
            order = {id(n): i for i, n in enumerate(model.graph)}
            record = [{"backend": s.backend, "nodes": [order[id(n)] for n in s.nodes], "inputs": s.inputs,
                       "outputs": s.outputs, "flops": s.flops, "ops": s.op_types()} for s in segments]
            (out / "partition.json").write_text(json.dumps(record, indent=1))
            return {"segments": [{k: v for k, v in s.items() if k != "nodes"} for s in record]}

        def lower_stage(results, out: Path) -> dict:
            from edgebuild.graph.partition import Segment
            from edgebuild_mpsgraph.segments import lower_segment

            model, _ = load_model(results["optimize"].path / "model.onnx", registry)
            model.graph.sort()
            nodes = list(model.graph)
            record = json.loads((results["partition"].path / "partition.json").read_text())
            segments = [Segment(s["backend"], [nodes[i] for i in s["nodes"]], s["inputs"], s["outputs"], s["flops"])
                        for s in record]
            specs = [lower_segment(model, s, i, out, params=lower_params, registry=registry).model_dump(mode="json")
                     for i, s in enumerate(segments)]
            return {"segments": specs, **graph_borders(model, specs), "renamings": segment_renamings(specs)}

        def package_stage(results, out: Path) -> dict:
            return self.package(results["lower"], out, recipe, variant.name, plugins)

        stages = [
            # each stage's files (edgebuild.store.layout): a remote entry holding others is refused
            Stage("partition", partition_params, ["optimize"], plugins, produce=partition_stage,
                  extra={"layout": ("partition.json",)}),
            Stage("lower", lower_params, ["optimize", "partition"], plugins, produce=lower_stage,
                  extra={"layout": ("segments/**",)}),
            Stage("package", {"name": recipe.name, "variant": variant.name}, ["lower"], plugins,
                  produce=package_stage, extra={"artifact": ARTIFACT, "layout": (f"{ARTIFACT}/**", *MLPACKAGE)}),
        ]
        if recipe.validate_ is not None:
            section = recipe.validate_

            def validate_stage(results, out: Path) -> dict:
                from edgebuild.bundle.session import InferenceSession
                from edgebuild.dag.validate import save
                from edgebuild_mpsgraph.validation import validate_bundle

                produced = results["package"].info.get("artifact", ARTIFACT)
                session = InferenceSession(results["package"].path / produced, registry=registry, native=False)
                record = validate_bundle(section, results["resolve"].path, dump["source"]["inputs"], session.run,
                                         variant.base_dir, registry)
                return save(out, record)

            from edgebuild.verify.files import digest_params

            params = {"validate": dump["validate"], **digest_params(section, variant.base_dir)}
            stages.append(Stage("validate", params, ["package", "resolve"], plugins, produce=validate_stage,
                                extra={"layout": VALIDATION}))
        return stages

    @staticmethod
    def package(lowered, out_dir: Path, recipe, variant: str, plugins: dict) -> dict:
        """Write ``out_dir/bundle`` (manifest + segments), or ``out_dir/model.mlpackage`` when Core
        ML runs the whole model; ``info["artifact"]`` names which."""
        from edgebuild.bundle.manifest import HandOffSpec, Manifest, write_manifest
        from edgebuild.versions import edgebuild_version
        from edgebuild.graph.partition import HandOff

        info = lowered.info
        segments = info["segments"]
        if len(segments) == 1 and segments[0]["backend"] == "coreml":  # a plain Core ML model
            shutil.copytree(lowered.path / segments[0]["files"]["model"], out_dir / "model.mlpackage")
            return {"kind": "mlpackage", "segments": 1, "artifact": "model.mlpackage"}
        bundle_dir = out_dir / ARTIFACT
        bundle_dir.mkdir(parents=True)
        shutil.copytree(lowered.path / "segments", bundle_dir / "segments")
        producer = {o["name"]: s["index"] for s in segments for o in s["outputs"]}
        graph_inputs = {t["name"] for t in info["inputs"]}
        edges = [HandOff(t["name"], None if t["name"] in graph_inputs else producer.get(t["name"]), s["index"])
                 for s in segments for t in s["inputs"]]
        edges += [HandOff(t["name"], producer.get(t["name"]), None) for t in info["outputs"]]
        manifest = Manifest(name=recipe.name, variant=variant, compute_policy=recipe.compute.policy,
                            inputs=info["inputs"], outputs=info["outputs"], segments=segments,
                            handoffs=[HandOffSpec(tensor=e.tensor, from_segment=e.producer, to_segment=e.consumer)
                                      for e in edges],
                            versions={"edgebuild": edgebuild_version(), **plugins})
        write_manifest(manifest, bundle_dir)
        return {"kind": "bundle", "segments": len(segments), "artifact": ARTIFACT,
                "backends": [s["backend"] for s in segments],
                "size_bytes": sum(f.stat().st_size for f in bundle_dir.rglob("*") if f.is_file())}
