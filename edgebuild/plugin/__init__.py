"""The public API for plugin authors: everything a plugin may import from edgebuild.

A plugin imports from ``edgebuild.plugin`` and its submodules only; the rest of the core may change
between releases without notice (an import-linter contract holds the first-party plugins to it).
This module is cheap to import: registering a plugin loads nothing heavy. The submodules hold what a
stage body needs and import their libraries when imported:

- :mod:`edgebuild.plugin.graph` — stage models on disk, partitioning, the ONNX frontend to extend,
  source resolution helpers, the quantised-op rewrites and the fused ops' references;
- :mod:`edgebuild.plugin.validation` — validation inputs and specs, the validate section;
- :mod:`edgebuild.plugin.recipe` — recipe models and shape helpers a backend reads;
- :mod:`edgebuild.plugin.store` — store files, links and layouts;
- :mod:`edgebuild.plugin.bundle` — the bundle manifest and the inference session;
- :mod:`edgebuild.plugin.reference` — numpy reference kernels shared by every executor;
- :mod:`edgebuild.plugin.pages` — releasing mapped weight pages;
- :mod:`edgebuild.plugin.testing` — pytest helpers to test a lowering against its reference.

``docs/plugins.md`` documents the surface; names leave it only with a release note in the CHANGELOG.
"""

from edgebuild.collections_scope import older_objects_frozen
from edgebuild.conformance.cases import Case as ConformanceCase
from edgebuild.custom_ops import OpReference
from edgebuild import deferred_sympy
from edgebuild.recipe.factories import check_factory_spelling, resolve_factory
from edgebuild.errors import (
    BuildError,
    EdgebuildError,
    NotRepresentable,
    PluginError,
    RecipeError,
    UsageError,
    ValidationFailed,
)
from edgebuild.hookspecs import hookimpl
from edgebuild.progress import report as report_progress
from edgebuild.protocols import (
    Arrays,
    Backend,
    Candidate,
    ConformanceRunner,
    CustomOp,
    Frontend,
    Generator,
    GraphPass,
    RecipeSection,
    Resolver,
    Runner,
    Runtime,
    Skipped,
    StatefulModel,
)
from edgebuild.registration import STANDARD_DOMAINS, Lazy, LoweringSet, OpEntry, OpTable, standard_domain, unique_name
from edgebuild.registry import Registry, get_registry
from edgebuild.stage import Result, Stage, StageInputs, StageParams
from edgebuild.threads import blas_threads, cpu_threads, requested_sample_workers
from edgebuild.versions import edgebuild_version
from edgebuild.worker_processes import can_start_workers, worker_context

__all__ = [
    # registering
    "hookimpl", "Lazy", "LoweringSet", "OpTable", "OpEntry", "Registry", "get_registry",
    "STANDARD_DOMAINS", "standard_domain", "unique_name",
    "OpReference",
    # what the core calls on registered objects
    "check_factory_spelling", "resolve_factory",
    "Backend", "ConformanceCase", "ConformanceRunner", "CustomOp", "Frontend", "Generator", "GraphPass", "RecipeSection", "Resolver",
    "Runtime", "StatefulModel", "Arrays", "Runner", "Candidate", "Skipped",
    # declaring stages
    "Stage", "StageParams", "StageInputs", "Result", "edgebuild_version",
    # errors
    "EdgebuildError", "UsageError", "RecipeError", "BuildError", "NotRepresentable", "PluginError",
    "ValidationFailed",
    # running inside a stage
    "report_progress", "cpu_threads", "blas_threads", "can_start_workers", "worker_context",
    "requested_sample_workers", "older_objects_frozen",
    # importing a library that imports sympy without importing sympy
    "deferred_sympy",
]
