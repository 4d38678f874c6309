"""Reading StableHLO with the MLIR bindings that ship with jaxlib: one context with the dialects a
JAX export uses, and a module from MLIR text, MLIR bytecode or a portable artifact."""

from __future__ import annotations

from pathlib import Path

from edgebuild.plugin import BuildError


def require_jaxlib():
    try:
        from jaxlib.mlir import ir  # noqa: F401
    except ImportError as exc:
        raise BuildError("a StableHLO source needs jax and jaxlib",
                         hint="pip install 'edgebuild[jax]'") from exc


def new_context():
    """An MLIR context with func, stablehlo, chlo and the upstream dialects jaxlib registers."""
    require_jaxlib()
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import chlo, sdy, stablehlo

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    stablehlo.register_dialect(context)
    chlo.register_dialect(context)
    sdy.register_dialect(context)
    return context


def parse_module(data: bytes, context, *, origin: Path | str):
    """A module from MLIR text, MLIR bytecode, or a StableHLO portable artifact (versioned VHLO
    bytecode, as ``jax.export`` serializes it). ``origin`` names the file in messages."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with context:
        errors = []
        if data[:4] == b"ML\xefR":  # MLIR bytecode: plain, or a portable artifact of the vhlo dialect
            try:
                return stablehlo.deserialize_portable_artifact(context, data)
            except Exception as exc:  # not VHLO: ordinary bytecode
                errors.append(exc)
            try:
                return ir.Module.parse(data)
            except Exception as exc:
                errors.append(exc)
        else:
            try:
                return ir.Module.parse(data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                errors.append(exc)
            except Exception as exc:
                errors.append(exc)
        detail = str(errors[-1]).strip().splitlines()
        raise BuildError(f"{Path(str(origin)).name}: not a StableHLO module: {' '.join(detail[:3])}",
                         hint="give MLIR text (.mlir), MLIR bytecode (.mlirbc) or a serialized jax.export")
