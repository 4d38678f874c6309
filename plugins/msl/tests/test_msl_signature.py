"""Declarations against kernel signatures, and the subset scan: errors name kernel, parameter and line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import msl_kernels as kernels  # noqa: E402

from edgebuild_msl import KernelError, UnsupportedConstruct, compile_kernel  # noqa: E402
from edgebuild_msl.signature import check_signature, parse_signature  # noqa: E402


def test_parse_signature_reads_every_parameter():
    sig = parse_signature(kernels.SOFTMAX, "softmax_rows")
    by_name = {p.name: p for p in sig.parameters}
    assert [p.name for p in sig.parameters] == ["x", "y", "cols", "scratch", "row", "lid", "size"]
    assert (by_name["x"].address_space, by_name["x"].const, by_name["x"].type, by_name["x"].index) == ("device", True, "float", 0)
    assert (by_name["cols"].address_space, by_name["cols"].indirection) == ("constant", "&")
    assert (by_name["scratch"].attribute, by_name["scratch"].index) == ("threadgroup", 0)
    assert by_name["row"].attribute == "threadgroup_position_in_grid"


def test_well_formed_kernels_pass():
    """Each declaration matches its kernel: the check returns the parsed signature, with every
    declared buffer bound to a parameter of that index."""
    for spec in (kernels.vector_add(), kernels.tiled_matmul(), kernels.row_sum(), kernels.softmax(), kernels.vector_mix()):
        sig = check_signature(spec)
        assert sig.entry == spec.entry
        for name, index in spec.buffers.items():
            param = sig.buffer(index)
            assert param is not None, f"{spec.entry}: {name} at buffer({index}) not found"
            assert param.const == (name in {t.name for t in spec.inputs}), f"{spec.entry}: {name} writability"
        for constant in spec.constants:
            assert sig.buffer(constant.index) is not None


@pytest.mark.parametrize("edit,message", [
    (("device float* c [[buffer(2)]]", "device const float* c [[buffer(2)]]"), r"parameter 'c'.*output 'c' must be writable"),
    (("device const float* b [[buffer(1)]]", "device float* b [[buffer(1)]]"), r"parameter 'b'.*input 'b' is writable"),
    (("device const float* b [[buffer(1)]]", "device const int* b [[buffer(1)]]"), r"parameter 'b'.*float32.*not int"),
    (("constant uint& n [[buffer(3)]]", "constant float& n [[buffer(3)]]"), r"parameter 'n'.*declared uint, the kernel reads float"),
    (("[[buffer(2)]]", "[[buffer(7)]]"), r"output 'c' is declared at \[\[buffer\(2\)\]\] but no kernel parameter has that index"),
    (("uint gid [[thread_position_in_grid]]", "uint gid"), r"parameter 'gid'.*has no attribute"),
])
def test_signature_mismatch_names_kernel_and_parameter(edit, message):
    spec = kernels.vector_add(kernels.VECTOR_ADD.replace(*edit))
    with pytest.raises(KernelError, match=message) as info:
        compile_kernel(spec)
    assert "'vector_add' (test.msl::VectorAdd)" in str(info.value)


def test_missing_entry_point_lists_the_kernels_found():
    spec = kernels.vector_add()
    spec.entry = "vec_add"
    with pytest.raises(KernelError, match="kernels found: vector_add"):
        check_signature(spec)


def test_parameter_bound_to_nothing():
    spec = kernels.vector_add(kernels.VECTOR_ADD.replace("uint gid", "device float* extra [[buffer(4)]],\n    uint gid"))
    with pytest.raises(KernelError, match=r"parameter 'extra'.*\[\[buffer\(4\)\]\] is bound to nothing"):
        check_signature(spec)


def test_declared_buffer_without_parameter():
    spec = kernels.vector_add()
    spec.buffers = {"a": 0, "b": 1, "c": 5}
    with pytest.raises(KernelError, match=r"output 'c' is declared at \[\[buffer\(5\)\]\]"):
        check_signature(spec)


@pytest.mark.parametrize("snippet,construct", [
    ("texture2d<float, access::read> img [[texture(0)]],", "textures"),
    ("sampler s [[sampler(0)]],", "samplers"),
    ("device float** table [[buffer(9)]],", "pointers to pointers"),
])
def test_unsupported_parameter_constructs(snippet, construct):
    source = kernels.VECTOR_ADD.replace("uint gid [[thread_position_in_grid]]", snippet + "\n    uint gid [[thread_position_in_grid]]")
    with pytest.raises(UnsupportedConstruct, match=rf"line 9: {construct}"):
        compile_kernel(kernels.vector_add(source))


@pytest.mark.parametrize("body,construct", [
    ("simdgroup_float8x8 m;", "simdgroup_matrix"),
    ("float (*fn)(float) = nullptr;", "function pointers"),
    ("packed_float3 p;", "packed vector types"),
    ("float r = quad_shuffle(a[gid], 1);", "quad-group functions"),
])
def test_unsupported_body_constructs_name_the_line(body, construct):
    source = kernels.VECTOR_ADD.replace("if (gid >= n) return;", "if (gid >= n) return;\n    " + body)
    with pytest.raises(UnsupportedConstruct, match=rf"line 11: {construct}.*outside the MSL subset"):
        compile_kernel(kernels.vector_add(source))


def test_unknown_function_is_a_compile_error_not_a_miscompile():
    source = kernels.VECTOR_ADD.replace("a[gid] + b[gid]", "a[gid] + not_an_msl_function(b[gid])")
    with pytest.raises(KernelError, match="does not compile against the MSL emulation"):
        compile_kernel(kernels.vector_add(source))
