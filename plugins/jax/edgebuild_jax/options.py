"""``source.options`` of a StableHLO source, validated with the recipe's file:line."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import ConfigDict, Field

from edgebuild.plugin import RecipeSection

KIND_BY_SUFFIX = {".jaxexport": "exported", ".mlir": "mlir", ".mlirbc": "mlir"}


class StableHLOOptions(RecipeSection):
    """What the file holds and how its entry function's values are named."""

    model_config = ConfigDict(extra="forbid")

    kind: Optional[Literal["exported", "mlir"]] = Field(
        default=None,
        description="exported: what jax.export's Exported.serialize() writes; mlir: a StableHLO module as MLIR "
        "text or bytecode (a portable artifact too); default from the suffix (.jaxexport, .mlir, .mlirbc)",
    )
    function: Optional[str] = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][\w.$-]*$",
                                    description="the entry function; default main, else the module's only public one")
    input_names: Optional[list[str]] = Field(
        default=None, min_length=1,
        description="names of the entry function's arguments; default the names jax.export records (loc(\"x\")), "
        "else input_0, input_1, ...")
    output_names: Optional[list[str]] = Field(
        default=None, min_length=1,
        description="names of the results; default jax.result_info, else output_0, output_1, ...")


def parse_options(options: dict | StableHLOOptions | None) -> StableHLOOptions:
    if isinstance(options, StableHLOOptions):
        return options
    return StableHLOOptions.model_validate(options or {})
