"""The ``pytorch`` frontend: a PyTorch source -> ``model.onnx`` (route a) or ``model.mlpackage`` (route b)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from edgebuild.plugin import BuildError, EdgebuildError, Frontend
from edgebuild_pytorch.capture import bound_module, call_module, capture, output_names
from edgebuild_pytorch.inputs import plan_inputs
from edgebuild_pytorch.loading import load_source, require_torch, source_kind
from edgebuild_pytorch.options import PyTorchOptions, parse_options
from edgebuild_pytorch.plugin import LIBRARIES
from edgebuild_pytorch.weight_pages import pages_dropped_after_use

ROUTE_FILE = "route.json"


class PyTorchFrontend(Frontend):
    """Registered as the ``pytorch`` frontend; see the plugin's README for the recipe options."""

    libraries = LIBRARIES  # edgebuild_pytorch.plugin says why

    def import_model(self, path: Path, inputs: dict[str, dict], out_dir: Path, *,
                     options: PyTorchOptions | dict | None = None, base_dir: Path | None = None) -> dict:
        start = time.perf_counter()
        path, out_dir = Path(path), Path(out_dir)
        torch = require_torch()
        opts = parse_options(options)
        if source_kind(path, opts) == "causal_lm":
            return self._import_causal_lm(path, inputs, out_dir, opts, base_dir, start)
        plan = plan_inputs(inputs)
        loaded = load_source(path, opts, base_dir)
        example_arrays = plan.example_arrays()
        eager = loaded.fresh()
        with pages_dropped_after_use(eager):  # mapped weights read once each, not all kept resident
            outputs = call_module(eager, {**example_arrays, **plan.fixed}, loaded.positional)
        del eager
        names = output_names(outputs, opts.output_names)
        example = tuple(torch.from_numpy(a) for a in example_arrays.values())
        try:
            program = capture(loaded.kind, bound_module(loaded.fresh(), plan, loaded.positional), example)
        except Exception as exc:
            raise BuildError(
                f"{path.name}: torch.export could not capture the {loaded.kind} model: "
                f"{type(exc).__name__}: {_first_line(exc)}",
                hint="the model must run with the recipe's input shapes; data-dependent control flow "
                "needs a fixed value or a rewrite",
            ) from exc

        out_dir.mkdir(parents=True, exist_ok=True)
        report: dict = {"kind": loaded.kind, **loaded.details, "fixed_inputs": sorted(plan.fixed),
                        "outputs_named": names}
        free_specs = {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in plan.free.items()}
        route, reason = opts.route, None
        if route in ("onnx", "auto"):
            try:
                from edgebuild_pytorch.onnx_route import import_through_onnx

                report.update(import_through_onnx(program, out_dir, opset=opts.opset, input_specs=free_specs,
                                                  output_names=names))
                route = "onnx"
            except Exception as exc:
                if opts.route == "onnx":
                    raise _as_build_error(exc, path, "the ONNX exporter") from exc
                reason = f"ONNX export failed: {type(exc).__name__}: {_first_line(exc)}"
                route = "coreml"
        if route == "coreml":
            from edgebuild_pytorch.coreml_route import convert_with_coremltools

            try:
                report.update(convert_with_coremltools(program, out_dir, input_names=list(plan.free),
                                                       output_names=names))
            except Exception as exc:
                raise _as_build_error(exc, path, "coremltools' torch frontend", earlier=reason) from exc
        artifact = "model.onnx" if route == "onnx" else "model.mlpackage"
        report.update({"route": route, "artifact": artifact, "fallback_reason": reason,
                       "seconds": round(time.perf_counter() - start, 3)})
        (out_dir / ROUTE_FILE).write_text(json.dumps(
            {"route": route, "artifact": artifact,
             "inputs": free_specs, "outputs": names, "fallback_reason": reason}, indent=1))
        return report

    def _import_causal_lm(self, path: Path, inputs: dict | None, out_dir: Path, opts: PyTorchOptions,
                          base_dir: Path | None, start: float) -> dict:
        """A causal LM: exported with its KV cache as graph inputs and outputs, dims left dynamic
        (``inputs`` may pin some, as for an ONNX source)."""
        from edgebuild.plugin.graph import DATA_FILE, OnnxFrontend, copying
        from edgebuild.plugin.pages import file_offsets
        from edgebuild.plugin.store import refer

        from edgebuild_pytorch.causal_lm import export_decoder, input_names, output_names
        from edgebuild_pytorch.file_weights import reference_file_weights
        from edgebuild_pytorch.onnx_route import drop_written_pages

        loaded = load_source(path, opts, base_dir)
        try:
            # Handed over in memory, its weights pointing into the checkpoint where they are its
            # bytes unchanged: the import refers to that file (a large one), else keeps a copy of
            # it, made while the model exports.
            mapped = bool(file_offsets(path))
            out_dir.mkdir(parents=True, exist_ok=True)
            referred = mapped and refer(path, out_dir / DATA_FILE)
            with copying(path, out_dir / DATA_FILE) if mapped and not referred else contextlib.nullcontext() as copied:
                onnx_model = export_decoder(loaded.module, opset=opts.opset)
                if mapped:
                    reference_file_weights(onnx_model.graph, path)
                    if not referred:
                        copied()
                report = OnnxFrontend().import_ir(onnx_model, path, inputs or {}, out_dir,
                                                  data_copied_from=path if mapped else None)
            drop_written_pages(onnx_model)
        except Exception as exc:
            raise _as_build_error(exc, path, "the causal LM export") from exc
        names_in, names_out = input_names(loaded.module), output_names(loaded.module)
        report.update({"kind": "causal_lm", **loaded.details, "architecture": type(loaded.module).__name__,
                       "outputs_named": names_out, "route": "onnx", "artifact": "model.onnx",
                       "fallback_reason": None, "seconds": round(time.perf_counter() - start, 3)})
        (out_dir / ROUTE_FILE).write_text(json.dumps(
            {"route": "onnx", "artifact": "model.onnx", "inputs": {n: None for n in names_in},
             "outputs": names_out, "fallback_reason": None}, indent=1))
        return report

    def option_files(self, options: PyTorchOptions, source: Path | None, base_dir: Path) -> list[Path]:
        """Local files the options name (a config file): the core puts their digests in the import
        stage's cache key, so editing one rebuilds. ``source`` is the model file when it is local."""
        from edgebuild_pytorch.sources import local_config

        spec = options.config
        if options.kind == "causal_lm" and not spec:
            from edgebuild_pytorch.causal_lm import DEFAULT_CONFIG

            spec = DEFAULT_CONFIG
        if not spec or spec.startswith(("pypi:", "https://", "http://")):
            return []
        found = local_config(spec, weights=source, base_dir=base_dir)
        return [found] if found is not None else []

    def reference(self, path: Path, inputs: dict[str, dict], options: PyTorchOptions | None, base_dir: Path | None = None):
        """Runner for the validate stage: the source module in eager mode (``inputs``: the recipe's
        ``source.inputs``; ``options``: its ``source.options``, validated at load). A causal LM has
        none: its samples run onnxruntime on the exported decoder; ``generator`` is its reference."""
        if source_kind(Path(path), parse_options(options)) == "causal_lm":
            return None
        from edgebuild_pytorch.reference import reference_runner

        return reference_runner(path, options, base_dir)

    def generator(self, path: Path, options: PyTorchOptions | None, base_dir: Path | None = None):
        """Greedy generation with the source itself (kind causal_lm: the eager model and its own
        cache), for validating a generative recipe; None for other kinds."""
        from edgebuild_pytorch.reference import reference_generator

        return reference_generator(path, options, base_dir)

    def input_specs(self, inputs: dict[str, dict]) -> dict[str, dict]:
        """The shape, dtype (and fixed value) of every input, in the format of ``onnx_input_specs``."""
        plan = plan_inputs(inputs or {})
        specs = {name: {"shape": shape, "dtype": dtype} for name, (shape, dtype) in plan.free.items()}
        for name, value in plan.fixed.items():
            specs[name] = {"shape": list(value.shape), "dtype": value.dtype.name, "value": value.tolist()}
        return specs


def _as_build_error(exc: Exception, path: Path, what: str, earlier: str | None = None) -> EdgebuildError:
    if isinstance(exc, EdgebuildError):
        return exc
    message = f"{path.name}: {what} failed: {type(exc).__name__}: {_first_line(exc)}"
    if earlier:
        message += f"\n  (tried first: {earlier})"
    return BuildError(message, hint="try the other route with source.options.route, or report the model")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
