"""``edgebuild kernels``: every installed custom op's Metal kernel against its numpy reference.

Registered through ``edgebuild_register_commands``; numpy and the emulator load when it runs.
"""

from __future__ import annotations

import json
import sys

import typer


def kernels(
    tsan: bool = typer.Option(False, "--tsan", help="build with ThreadSanitizer: a missing barrier is a race"),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="max abs difference from the numpy reference"),
    as_json: bool = typer.Option(False, "--json"),
):
    """Check every installed custom-op Metal kernel against its numpy reference (CPU emulation)."""
    from edgebuild.plugin import get_registry

    rows = check_kernels(get_registry(), tsan=tsan, tolerance=tolerance)
    if as_json:
        sys.stdout.write(json.dumps({"kernels": rows, "tsan": tsan}) + "\n")
    else:
        for row in rows:
            detail = f"max abs err {row['max_abs_err']:.3g}" if "max_abs_err" in row else row.get("reason", "")
            typer.echo(f"{row['status']:<8} {row['op']}  {detail}")
    raise typer.Exit(1 if any(row["status"] == "fail" for row in rows) else 0)


def check_kernels(registry, *, tsan: bool, tolerance: float) -> list[dict]:
    """One ``{"op", "status": "pass"|"fail"|"skipped", "max_abs_err"?, "reason"?}`` per custom op,
    run on seeded random inputs of the spec's ``example_shapes``."""
    import numpy as np

    from edgebuild_msl.errors import KernelError
    from edgebuild_msl.kernel import check_kernel

    rows = []
    for domain, op_type in sorted(registry.names("custom_ops")):
        spec, op = registry.get("custom_ops", (domain, op_type)), f"{domain}::{op_type}"
        shapes = getattr(spec, "example_shapes", None)
        if not shapes:
            rows.append({"op": op, "status": "skipped", "reason": "no example_shapes"})
            continue
        rng = np.random.default_rng(0)
        dtypes = {d.name: d.dtype for d in spec.inputs}
        inputs = {n: rng.standard_normal(shape).astype(dtypes.get(n, "float32")) for n, shape in shapes.items()}
        try:
            error = check_kernel(spec, inputs, tsan=tsan)
            rows.append({"op": op, "status": "pass" if error <= tolerance else "fail", "max_abs_err": error})
        except KernelError as exc:
            rows.append({"op": op, "status": "fail", "reason": str(exc)})
    return rows
