"""``source.options`` of a StableHLO source, validated with the recipe's file:line."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgebuild.plugin import RecipeSection, check_factory_spelling

KIND_BY_SUFFIX = {".jaxexport": "exported", ".mlir": "mlir", ".mlirbc": "mlir"}


class StableHLOOptions(RecipeSection):
    """What the file holds and how its entry function's values are named."""

    model_config = ConfigDict(extra="forbid")

    kind: Optional[Literal["exported", "mlir", "function"]] = Field(
        default=None,
        description="exported: what jax.export's Exported.serialize() writes; mlir: a StableHLO module as MLIR "
        "text or bytecode (a portable artifact too); function: a JAX function from factory, the model file "
        "holding its parameters (.msgpack, .safetensors, .npz); default from the suffix, function with a factory",
    )
    factory: Optional[str] = Field(
        default=None, description="'package.module:callable' returning (apply, params): apply(params, *inputs) "
        "is the model, params a pytree giving the parameters' structure")
    factory_kwargs: dict[str, Any] = Field(default={}, description="keyword arguments for the factory")
    function: Optional[str] = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][\w.$-]*$",
                                    description="the entry function; default main, else the module's only public one")
    input_names: Optional[list[str]] = Field(
        default=None, min_length=1,
        description="names of the entry function's arguments; default the names jax.export records (loc(\"x\")), "
        "else input_0, input_1, ...")
    output_names: Optional[list[str]] = Field(
        default=None, min_length=1,
        description="names of the results; default jax.result_info, else output_0, output_1, ...")


    @field_validator("factory")
    @classmethod
    def _factory_spelling(cls, value):
        return check_factory_spelling(value)

    @model_validator(mode="after")
    def _factory_fits_kind(self):
        if self.kind == "function" and self.factory is None:
            raise ValueError("kind function needs a factory ('package.module:callable') returning (apply, params)")
        if self.kind in ("exported", "mlir") and self.factory is not None:
            raise ValueError(f"kind {self.kind} carries its own program; drop the factory")
        return self


def parse_options(options: dict | StableHLOOptions | None) -> StableHLOOptions:
    if isinstance(options, StableHLOOptions):
        return options
    return StableHLOOptions.model_validate(options or {})
