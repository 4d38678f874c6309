"""edgebuild-msl: custom Metal kernels — declarations, signature checks, a CPU emulation of
the MSL subset (with a ThreadSanitizer mode) and, on macOS, ``.metallib`` builds."""

__version__ = "0.1.0"

from edgebuild_msl.errors import KernelError, KernelRace, UnsupportedConstruct
from edgebuild_msl.kernel import CompiledKernel, check_kernel, compile_kernel
from edgebuild_msl.spec import ConstantBinding, KernelSpec, TensorDecl

__all__ = [
    "CompiledKernel", "ConstantBinding", "KernelError", "KernelRace", "KernelSpec", "TensorDecl",
    "UnsupportedConstruct", "check_kernel", "compile_kernel",
]
