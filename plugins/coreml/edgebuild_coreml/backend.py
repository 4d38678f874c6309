"""The Core ML backend: lower -> (compress) -> package -> validate stages of a variant."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from edgebuild.dag.stages import Stage

ARTIFACT = "model.mlpackage"


def _load_onnx(path: Path):
    import onnx_ir as ir

    return ir.load(str(path))


class CoreMLBackend:
    name = "coreml"
    artifact = ARTIFACT

    def stages(self, variant, registry, plugins: dict[str, str]) -> list[Stage]:
        recipe = variant.recipe
        target = recipe.target
        dump = recipe.model_dump(mode="json", by_alias=True)
        lower_params = {
            "deployment_target": target.deployment_target,
            "precision": target.precision,
            "inputs": dump["source"]["inputs"],
            "options": dump["target"]["options"],
            "compute": {"fp16_guard": recipe.compute.fp16_guard, "rewrites": recipe.compute.rewrites},
        }

        def lower(results, out: Path) -> dict:
            return self.lower(results["optimize"].path / "model.onnx", out / ARTIFACT, lower_params, registry)

        stages = [Stage("lower", lower_params, ["optimize"], plugins, produce=lower)]
        last = "lower"
        if recipe.compression:
            compress_params = {"compression": recipe.compression, "deployment_target": target.deployment_target}

            def compress(results, out: Path) -> dict:
                from edgebuild_coreml.compress.apply import compress_mlpackage

                return compress_mlpackage(results["lower"].path / ARTIFACT, out / ARTIFACT, recipe.compression,
                                          target=target.deployment_target)

            stages.append(Stage("compress", compress_params, ["lower"], plugins, produce=compress))
            last = "compress"
        metadata = {
            "recipe": recipe.name, "variant": variant.name, "compute_policy": recipe.compute.policy,
            "author": recipe.metadata.author, "license": recipe.metadata.license,
            "description": recipe.metadata.description, "version": recipe.metadata.version,
            "versions": {"edgebuild": __import__("edgebuild").__version__, **plugins},
        }

        def package(results, out: Path) -> dict:
            return self.package(results[last].path / ARTIFACT, out / ARTIFACT,
                                dict(metadata, source_sha256=results["resolve"].digest))

        stages.append(Stage("package", {"metadata": metadata}, [last, "resolve"], plugins, produce=package,
                            extra={"artifact": ARTIFACT}))
        if recipe.validate_ is not None:
            section = recipe.validate_

            def validate(results, out: Path) -> dict:
                from edgebuild.dag.validate import save, validate as run_validation

                runner = self.runner(results["package"].path / ARTIFACT, target.precision)
                record = run_validation(section, results["resolve"].path, dump["source"]["inputs"], runner,
                                        variant.base_dir)
                return save(out, record)

            stages.append(Stage("validate", {"validate": dump["validate"]}, ["package", "resolve"], plugins,
                                produce=validate))
        return stages

    # -- stage bodies ---------------------------------------------------------------------
    def lower(self, model_path: Path, artifact: Path, params: dict, registry) -> dict:
        from edgebuild_coreml.lowering.converter import convert
        from edgebuild_coreml.lowering.package import save_mlpackage

        model = _load_onnx(model_path)
        result = convert(model, target=params["deployment_target"], precision=params["precision"], registry=registry)
        save_mlpackage(result, artifact, target=params["deployment_target"], precision=params["precision"],
                       input_specs=params["inputs"], metadata={}, consume=True)
        return {
            "op_counts": result.op_counts,
            "renamed_inputs": {k: v for k, v in result.input_names.items() if k != v},
            "renamed_outputs": {k: v for k, v in result.output_names.items() if k != v},
        }

    def package(self, src: Path, dst: Path, metadata: dict) -> dict:
        import coremltools as ct

        model = ct.models.MLModel(str(src), skip_model_load=True)
        model.author = metadata.get("author") or model.author
        model.license = metadata.get("license") or model.license
        model.short_description = metadata.get("description") or model.short_description
        if metadata.get("version"):
            model.version = metadata["version"]
        user = model.user_defined_metadata
        user["com.edgebuild.source_sha256"] = metadata["source_sha256"]
        user["com.edgebuild.recipe"] = metadata["recipe"]
        user["com.edgebuild.variant"] = metadata["variant"]
        user["com.edgebuild.compute_policy"] = metadata["compute_policy"]
        for name, version in metadata["versions"].items():
            user[f"com.edgebuild.version.{name}"] = version
        model.save(str(dst))
        return {"size_bytes": sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())}

    def runner(self, artifact: Path, precision: str):
        from edgebuild_coreml.interpreter import load_mlpackage, run_program

        program = load_mlpackage(artifact)
        return lambda inputs: run_program(program, inputs)


def on_macos() -> bool:
    return platform.system() == "Darwin"
