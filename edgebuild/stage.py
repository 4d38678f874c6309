"""How a stage is declared: typed parameters that are its cache key, and a body that reads nothing else.

A stage's :class:`StageParams` are built once, from the validated recipe, when the pipeline is
assembled; their canonical JSON dump is the ``params`` of the stage's cache key. The body is a
function defined at module level, ``body(params, inputs, out) -> info``: it gets the parameters,
the upstream stages' :class:`Result`\\ s (with the registry and the recipe's folder) and an empty
output directory, and it reads nothing else — no recipe, no variant, no closure — so whatever can
change its output is in its key::

    class Scale(StageParams):
        factor: float = 2.0

    def scale(params: Scale, inputs: StageInputs, out: Path) -> dict:
        data = (inputs.path("lower") / "x.bin").read_bytes()
        ...
        return {"size_bytes": ...}

    Stage("scale", Scale(factor=3.0), ["lower"], scale, uses=("lowerings",), libraries=("numpy",))

``uses`` names the registry kinds whose objects the body may call (``lowerings``, ``passes``,
``runtimes``, ...): every plugin that registered one of them, with its version (and its working
copy's digest), joins the key. ``libraries`` names the distributions that produce or judge the
output (coremltools, onnxruntime, ...): their installed versions join the key too. The core
fills both in (:attr:`Stage.plugins`, :attr:`Stage.libraries_versions`) when it assembles the
pipeline, and the lock file lists them per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict


class StageParams(BaseModel):
    """The base of every stage's parameters: frozen, no unknown fields; the dump is the key's ``params``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def key_params(self) -> dict:
        """What the cache key hashes: every field, defaults included, as JSON."""
        return self.model_dump(mode="json")


@dataclass
class Result:
    """What a finished stage hands downstream."""

    name: str
    key: str
    digest: str
    path: Path  # output directory (a file for ``resolve``)
    info: dict
    status: str  # "ran" | "cached" | "pulled" (from the remote cache)
    seconds: float


@dataclass(frozen=True)
class StageInputs:
    """What a body reads besides its parameters: its upstream stages' results, the registry (whose
    plugins for the stage's ``uses`` are in the key) and the recipe's folder (files named by the
    parameters are read below it; their digests are in the parameters)."""

    results: Mapping[str, Result]
    registry: Any = None
    base_dir: Path | None = None

    def path(self, stage: str) -> Path:
        return self.results[stage].path

    def info(self, stage: str) -> dict:
        return self.results[stage].info


Body = Callable[[Any, StageInputs, Path], "dict | None"]


@dataclass
class Stage:
    """One stage of a variant's build. ``body`` runs on a miss; ``resolve`` (the source stage only)
    stands outside the store. ``extra``: how the executor treats it (``layout``: the files it writes;
    ``exclusive``: a library with global state; ``artifact``: the variant's artifact is its output)."""

    name: str
    params: StageParams | dict
    deps: list[str]
    body: Body | None = None
    uses: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    resolve: Callable[[], Result] | None = None
    extra: dict = field(default_factory=dict)
    # ``judge(params, info, inputs) -> info``: what this variant reads of the stored output, from the
    # parameters the key leaves out (the validate stage's limits), applied whether it ran or was cached
    judge: Callable[[Any, dict, StageInputs], dict] | None = None
    # filled in by the core when it assembles the pipeline
    plugins: dict[str, str] = field(default_factory=dict)  # distribution -> key version
    libraries_versions: dict[str, str] = field(default_factory=dict)  # distribution -> installed version
    registry: Any = None
    base_dir: Path | None = None

    def key_params(self) -> dict:
        return self.params.key_params() if isinstance(self.params, StageParams) else self.params

    def recorded_params(self) -> dict:
        """What the lock file records: every parameter, those only ``judge`` reads (not in the key) too."""
        return self.params.model_dump(mode="json") if isinstance(self.params, StageParams) else self.params

    def run(self, results: Mapping[str, Result], out: Path) -> dict:
        """The body on ``results`` (the upstream stages') into the empty directory ``out``."""
        inputs = StageInputs({d: results[d] for d in self.deps}, self.registry, self.base_dir)
        return self.body(self.params, inputs, out) or {}

    def judged(self, result: Result, results: Mapping[str, Result]) -> Result:
        """``result`` (of this stage, ran or cached) as this variant reads it: through ``judge`` when
        the stage has one; variants sharing the stored output each judge it by their own parameters."""
        if self.judge is None:
            return result
        inputs = StageInputs({d: results[d] for d in self.deps}, self.registry, self.base_dir)
        return replace(result, info=self.judge(self.params, result.info, inputs))
