"""edgebuild-msl: custom Metal kernels — declarations, signature checks, a CPU emulation of
the MSL subset (with a ThreadSanitizer mode) and, on macOS, ``.metallib`` builds."""

__version__ = "0.1.0"

_EXPORTS = {
    "KernelError": "errors", "KernelRace": "errors", "UnsupportedConstruct": "errors",
    "CompiledKernel": "kernel", "check_kernel": "kernel", "compile_kernel": "kernel",
    "ConstantBinding": "spec", "KernelSpec": "spec", "TensorDecl": "spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # loaded on first use: edgebuild imports this package to find the plugin, and a build
    # that uses no kernel should not pay for numpy and the compiler driver
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"edgebuild_msl.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
