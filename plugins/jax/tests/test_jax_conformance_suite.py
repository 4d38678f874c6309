"""The stablehlo conformance suite: cases from jax.lax primitives, judged by the backend's runner."""

import numpy as np
import pytest

pytest.importorskip("jax")


@pytest.mark.slow  # the whole suite: every case exported, run by JAX and converted
def test_cases_cover_primitives_over_their_variants_with_jax_outputs():
    from edgebuild_jax.conformance import collect_cases

    cases = collect_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) and len(cases) > 150
    ops = {c.op for c in cases}
    assert {"lax.dot_general", "lax.conv_general_dilated", "lax.reduce_window", "lax.gather", "lax.scatter",
            "lax.sort", "lax.while", "lax.switch", "lax.pad"} <= ops
    conv = [c for c in cases if c.op == "lax.conv_general_dilated"]
    assert len(conv) >= 8 and all(c.model and c.reason is None for c in conv)
    assert all(isinstance(o, np.ndarray) for c in cases for o in c.outputs)


def test_the_suite_runs_through_the_conformance_command_machinery():
    from edgebuild.conformance.suite import run_suite

    result = run_suite("stablehlo", "coreml", ["lax.add", "dot_general", "lax.scan"], jobs=1)
    assert result["total"] == 10 + 10 + 1  # lax.add over float32, float16 and every integer width
    assert result["passed"] == result["total"], [c for c in result["cases"] if c["status"] != "pass"]
    assert set(result["by_op"]) == {"lax.add", "lax.dot_general", "lax.scan"}


def test_an_unknown_primitive_is_named():
    from edgebuild.plugin import UsageError
    from edgebuild_jax.conformance import collect_cases

    with pytest.raises(UsageError, match="no stablehlo conformance cases for: frobnicate"):
        collect_cases(["frobnicate"])
