"""What the core calls on the objects plugins register, as ``typing.Protocol`` classes.

Each hook in :mod:`edgebuild.hookspecs` names the protocol its objects follow. Every method the
core calls is declared here and documented where it is declared; the core calls nothing else and
never probes with ``getattr``. Subclass the protocol (``class MyFrontend(Frontend): ...``): members
with a body or a value are defaults you may override, the others you must provide. The registry
checks an object against its protocol on first use and names what is missing.

Plugins return data (stages, plans, reports, diagnostics); only the CLI prints.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    runtime_checkable,
)

from pydantic import BaseModel

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir


Arrays = Mapping[str, "np.ndarray"]
Runner = Callable[[Arrays], dict]
"""A reference or candidate executor: input arrays by name -> output arrays by name."""


@dataclass(frozen=True)
class Candidate:
    """A runner validation compares with the reference; ``parallel``: samples may run in threads."""

    runner: Runner
    parallel: bool = True


@dataclass(frozen=True)
class Skipped:
    """A runtime the recipe asks for that this machine cannot run (Core ML off macOS), and why."""

    reason: str


@dataclass(frozen=True)
class _ArtifactCall:
    """``runtime.run(artifact, inputs)`` as a runner (picklable, unlike a lambda)."""

    runtime: Any
    artifact: Path

    def __call__(self, inputs):
        return self.runtime.run(self.artifact, inputs)


@runtime_checkable
class Resolver(Protocol):
    """Turns a ``source.model`` URI into a local file (``edgebuild_register_resolvers``)."""

    def __call__(self, uri: str, *, sha256: Optional[str], workdir: Path, base_dir: Path) -> Path:
        """The local path of the model file. Verify ``sha256`` when given; never execute what was fetched;
        write only below ``workdir`` (the store's ``sources/``), atomically."""


@runtime_checkable
class Frontend(Protocol):
    """Imports a source format into ONNX (``edgebuild_register_frontends``)."""

    libraries: Sequence[str] = ()
    """The distributions whose versions decide what ``import_model`` writes (PyTorch: torch, transformers):
    they join the import stage's cache key, as onnx and onnx-ir do for every frontend."""

    sizes_derived_inputs: bool = False
    """True for a frontend whose source may leave a generative artifact's derived inputs symbolic (a JAX
    step's query length): the import stage's ``inputs`` then carry their sizes from ``generate``
    (``input_ids``: [1, query_lengths]), so they join its key."""

    def import_model(self, path: Path, inputs: dict, out_dir: Path, *, options: Any = None,
                     base_dir: Optional[Path] = None) -> dict:
        """Write ``out_dir/model.onnx`` (weights as external data beside it) and return facts for the report.
        A frontend that converts straight to a backend's format (PyTorch through coremltools) writes
        that artifact instead and names it in the facts' ``"artifact"``; ``optimize`` passes it through.

        ``inputs`` is the recipe's ``source.inputs`` as JSON; ``options`` its ``source.options`` as the model of
        the frontend's ``"<format>:source.options"`` recipe section (None when the recipe has none);
        ``base_dir`` the recipe's directory, for relative option paths."""

    def option_files(self, options: Any, source: Optional[Path], base_dir: Path) -> list[Path]:
        """Local files ``options`` name (a config): their digests join the import stage's cache key and
        they become build prerequisites (``--depfile``)."""
        return []

    def source_files(self, path: Path) -> list[Path]:
        """Files beside the source model ``path`` that are part of its content (an ONNX model's
        external data): their digests join the resolve stage's, so editing one alone rebuilds, and
        they become build prerequisites like the model."""
        return []

    def reference(self, path: Path, inputs: dict, options: Any, base_dir: Optional[Path] = None) -> Optional[Runner]:
        """A runner that evaluates the source itself (PyTorch: the eager module), or None to let
        validation run onnxruntime on the imported ONNX model. A runner with an ``input_specs``
        attribute (the format of ``input_specs`` below) says itself what it takes, read from the source;
        one with a ``float64()`` method returning ``(runner, evaluator name)`` evaluates the source in
        float64 for ``validate.reference: float64`` (float32 feeds in, float64 outputs out)."""
        return None

    def input_specs(self, inputs: dict) -> dict:
        """``{name: {"shape", "dtype"[, "value"]}}`` of the inputs ``reference`` takes (with ``reference``)."""
        return {}

    def generator(self, path: Path, options: Any, base_dir: Optional[Path] = None) -> Optional["Generator"]:
        """Greedy generation with the source itself (PyTorch: the eager causal LM and its own cache),
        the reference of a generative recipe; None to let validation run onnxruntime on the
        imported decoder (``edgebuild.verify.source_generation.OnnxGenerator``)."""
        return None


@runtime_checkable
class Generator(Protocol):
    """Greedy generation with a KV cache: the source's (reference) and the artifact's (candidate)."""

    def generate(self, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], "np.ndarray"]:
        """The ``new_tokens`` greedy tokens after ``prompt_ids``, and the logits [new_tokens, vocab] of
        the step that chose each one."""


@runtime_checkable
class GraphPass(Protocol):
    """A generic graph rewrite over ``onnx_ir`` (``edgebuild_register_passes``)."""

    description: str = ""
    """One line on what the pass rewrites, for people reading the plugin list."""

    default: bool = True
    """On unless the recipe's ``optimize.passes`` turns it off."""

    before_folding: bool = False
    """Run before constant folding (a pass that must see the weights' producers, e.g. DequantizeLinear)."""

    level: Optional[str] = None
    """The lowest ``optimize.level`` it runs at unless ``optimize.passes`` switches it: ``"O0"`` (the
    lowering needs it), ``"O1"`` (folding, simplification), ``"O2"`` (a fusion on by default),
    ``"O3"`` (opt-in). None: ``"O2"`` if ``default``, else ``"O3"``. A pass registered through
    ``Lazy`` says it in ``.known(level=...)``, as it says its ``default``."""

    def apply(self, model: "onnx_ir.Model") -> int:
        """Rewrite ``model`` in place; return how many times it rewrote the graph. Build rewrite-rule
        objects here, not once per process: a matcher keeps the last graph it matched, and its weights."""


@runtime_checkable
class Backend(Protocol):
    """Turns an optimised ONNX model into an artifact (``edgebuild_register_backends``)."""

    default: bool = False
    """This backend builds recipes that do not name ``target.backend``. At most one installed backend may
    claim it; with a single backend installed, that one is the default."""

    artifact: str = ""
    """The artifact's name inside a variant's output directory (``model.mlpackage``, ``bundle``)."""

    validation_runtimes: Sequence[str] = ()
    """The candidate runtimes ``validate.runtimes`` may name; a recipe that names none gets them all."""

    default_runtimes: Optional[Sequence[str]] = None
    """The runtimes validated when the recipe's ``validate.runtimes`` names none: None for all of
    ``validation_runtimes``, ``()`` for none (the variant is then built, not validated)."""

    validation_inputs: Sequence[str] = ()
    """The stages (besides the artifact's) whose ``Result.info`` :meth:`candidates` needs (Core ML: the
    lower stage's, for inputs and outputs the package renamed)."""

    validation_libraries: Sequence[str] = ()
    """The distributions whose versions decide how the candidates compute (the Core ML interpreter reads
    packages with coremltools): they join the validate stage's key."""

    def stages(self, variant: "Variant", registry: "Registry") -> list["Stage"]:
        """The stages after ``optimize`` up to the artifact (lower, compress, package; the last one's
        ``extra["artifact"]`` names it), each declared with typed parameters and a module-level body
        (:mod:`edgebuild.stage`). The core validates the artifact itself, through :meth:`candidates`."""

    def candidates(self, artifact: Path, runtimes: Sequence[str], *, precision: str, emulate_fp16: bool,
                   built: Mapping[str, dict], registry: "Registry") -> dict[str, "Candidate | Skipped"]:
        """The runners that validation compares with the reference, by runtime name, for the runtimes the
        recipe asks for: a :class:`Candidate`, or :class:`Skipped` saying why this machine cannot run it.
        ``built``: the ``info`` of the :attr:`validation_inputs` stages. The default runs every registered
        runtime of ``runtimes`` that can run the artifact."""
        found: dict = {}
        for name in runtimes:
            runtime = registry.get("runtimes", name)
            if runtime is None or not runtime.can_run(artifact):
                found[name] = Skipped(f"runtime {name!r} cannot run {Path(artifact).name} on this machine")
                continue
            found[name] = Candidate(_ArtifactCall(runtime, Path(artifact)), parallel=runtime.parallel_samples)
        return found

    def sessions(self, artifact: Path, runtimes: Sequence[str], *,
                 registry: "Registry") -> dict[str, "Callable[[], Any] | Skipped"]:
        """For a generative recipe: by runtime name, a function opening the artifact's
        ``InferenceSession`` (greedy generation is compared with the source's), or :class:`Skipped`."""
        return {}

    def check_recipe(self, recipe: "Recipe") -> None:
        """Raise :class:`edgebuild.recipe.errors.RecipeError` (with its path) for what only the backend
        can judge (a chip, a rewrite, a mode its deployment target lacks); run by ``edgebuild validate``."""
        return None

    def compute_plan(self, variant: "Variant", registry: "Registry", *, output_of: Callable[[str], Any],
                     chip: Optional[str] = None) -> Optional[dict]:
        """``{"ops", "breakdown", "total_ms", ...}`` for ``edgebuild plan``: where each op would run and
        why. ``output_of(stage)`` is a context manager yielding that stage's :class:`~edgebuild.stage.Result`
        (from the store, or built into a temporary directory that is removed afterwards: the store is
        only read). None: the backend predicts nothing."""
        return None

    def lower_segment(self, model: "onnx_ir.Model", directory: Path, *, params: dict,
                      registry: "Registry") -> dict:
        """Lower ``model``, one partition of a bundle, into ``directory``; return ``{"files", "compute_units",
        "input_names", "output_names", "boundary_dtypes"}`` (ONNX name -> the artifact's name, and the dtypes
        that cross the segment's border as another). ``params``: ``deployment_target``, ``precision``,
        ``policy``. A backend that cannot build bundle segments raises ``BuildError``."""
        from edgebuild.errors import BuildError

        raise BuildError(f"backend {type(self).__name__} does not build bundle segments")

    def conformance_runner(self) -> Optional["ConformanceRunner"]:
        """What runs ONNX node-test cases through this backend (``edgebuild conformance``), or None when
        the backend is not tested that way. Called in each worker process: import the executor here."""
        return None


@runtime_checkable
class ConformanceRunner(Protocol):
    """Runs one ONNX node-test case as the backend's artifacts would compute it (``Backend.conformance_runner``)."""

    notes: str = ""
    """How the cases run (target, precision, executor, what is folded): a sentence for the conformance table."""

    def run(self, model: Any, inputs: list) -> list:
        """The outputs of ``model`` (an ``onnx.ModelProto``) for ``inputs`` (arrays in graph-input order), in
        graph-output order. Raise :class:`edgebuild.errors.NotRepresentable` for what the artifact format
        cannot express (the case counts as unsupported); any other error makes the case an error."""


@runtime_checkable
class Runtime(Protocol):
    """Executes built artifacts (``edgebuild_register_runtimes``): reference executors on any platform,
    native ones where they exist."""

    name: str
    """Shown in validation results and ``validate.runtimes``."""

    native: bool = False
    """Runs the vendor's own runtime (Core ML on macOS): tried first by ``InferenceSession``."""

    parallel_samples: bool = True
    """Validation may run samples in threads (False when the runtime is not thread-safe)."""

    def can_run(self, artifact: Path) -> bool:
        """Whether this runtime executes ``artifact`` on this machine."""

    def run(self, artifact: Path, inputs: Arrays) -> dict:
        """Output arrays by name for ``inputs`` by name."""

    def input_names(self, artifact: Path) -> Optional[list[str]]:
        """The input names ``artifact`` takes (for ``verify``'s check against the reference), or None."""
        return None

    def input_shapes(self, artifact: Path) -> Optional[dict[str, list[int]]]:
        """The concrete shape of each input ``artifact`` takes, by the artifact's names (a flexible input:
        the shape it defaults to), or None when the runtime cannot tell. ``verify`` feeds both sides at
        these shapes when the source model's dims are symbolic."""
        return None

    def tensor_names(self, artifact: Path) -> dict:
        """The inputs and outputs ``artifact`` names differently from its source model:
        ``{"inputs": {source name: artifact name}, "outputs": {...}}`` (renamed ones only; empty
        maps when nothing was renamed). ``run`` speaks the artifact's names; ``InferenceSession``
        and ``verify`` translate with this, so their callers use the source model's names."""
        return {"inputs": {}, "outputs": {}}

    def inspect(self, artifact: Path) -> dict:
        """Ops, weights, compression and sizes of ``artifact`` (``edgebuild inspect``)."""
        return {}

    def open_stateful(self, artifact: Path) -> Optional["StatefulModel"]:
        """``artifact`` opened with fresh state when it keeps state between calls (a decoder whose KV
        cache lives in Core ML states); None for an artifact without state."""
        return None


class StatefulModel(Protocol):
    """A stateful artifact opened by ``Runtime.open_stateful``: each ``run`` reads and updates its state."""

    generate: dict
    """The artifact's generate description: ``max_context``, ``query_lengths`` (a list, or
    ``{"range": [lo, hi]}``), ``logits`` (``all`` | ``last_token``) and ``states``."""

    def run(self, inputs: Arrays) -> dict:
        """Output arrays by the artifact's names for ``input_ids`` [1, Q] and ``position`` [1] (int32)."""

    def reset(self) -> None:
        """Clear the state (an empty cache)."""


@runtime_checkable
class CustomOp(Protocol):
    """An op outside the ONNX standard a plugin lowers or implements (``edgebuild_register_custom_ops``):
    what validation evaluates a source model's node of it with, since onnxruntime cannot.
    ``edgebuild.plugin.OpReference`` is one made from a numpy function; ``edgebuild_msl.KernelSpec``
    (a Metal kernel) is another."""

    domain: str
    op_type: str

    inputs: Sequence[Any]
    """The op's inputs in order: names, or declarations with a ``name`` (``edgebuild_msl.TensorDecl``)."""

    outputs: Sequence[Any]
    """The op's outputs in order, like ``inputs``."""

    def run_reference(self, inputs: Arrays, attrs: Optional[Mapping[str, Any]] = None) -> dict:
        """Output arrays by name for one node: its input arrays by the op's input names, its attributes
        (those the node sets; apply the defaults of the others)."""


class RecipeSection(BaseModel):
    """The base of a plugin-owned recipe section's pydantic model (``edgebuild_register_recipe_sections``).

    A class, not a Protocol: pydantic models cannot also subclass one. The registry checks that a
    registered model subclasses it."""

    def check_recipe(self, recipe: "Recipe") -> None:
        """Raise ``RecipeError`` for what depends on the rest of the recipe; called once, after validation."""
        return None


CommandFactory = Callable[[], Any]
"""Returns a ``typer.Typer`` (a command group) or a function typer turns into one command."""


PROTOCOLS: dict[str, type] = {
    "resolvers": Resolver,
    "frontends": Frontend,
    "passes": GraphPass,
    "backends": Backend,
    "runtimes": Runtime,
    "custom_ops": CustomOp,
}
"""The protocol each registry kind's objects follow; checked when an object is first used."""


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks: those it does not have at all, and the methods
    the protocol only declares (a body that is a docstring or ``...``) that ``obj``'s class inherits
    from the protocol instead of defining. Members with a real body or a value are defaults."""
    if protocol is Resolver:
        return [] if callable(obj) else ["__call__"]
    declared, stubs = set(), {}
    for base in protocol.__mro__:
        if base in (Protocol, object) or base.__module__ == "typing":
            continue
        declared |= {n for n in vars(base) if not n.startswith("_")} | set(getattr(base, "__annotations__", {}))
        stubs.update({n: member for n, member in vars(base).items()
                      if not n.startswith("_") and n not in stubs and _only_declared(member)})

    def lacks(name: str) -> bool:
        if name in getattr(obj, "__dict__", {}):
            return False
        # looked up on the class, not the instance: a property is not evaluated
        owners = [k for k in type(obj).__mro__ if name in vars(k)]
        return not owners or (name in stubs and vars(owners[0])[name] is stubs[name])

    return sorted(name for name in declared if lacks(name))


@functools.lru_cache(maxsize=None)
def _only_declared(member: object) -> bool:
    """Whether ``member`` is a function whose body is only a docstring or ``...``: a protocol method
    with no default, which a class that subclasses the protocol must define itself."""
    import ast
    import inspect
    import textwrap

    if not inspect.isfunction(member):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(member)))
    except (OSError, TypeError, SyntaxError):  # no source to read: take it for a default
        return False
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    return bool(body) and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                              and (isinstance(s.value.value, str) or s.value.value is Ellipsis) for s in body)
