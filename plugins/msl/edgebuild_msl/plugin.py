"""Registers edgebuild-msl with edgebuild.

This plugin is a toolchain rather than a set of ops: op plugins declare their kernels with
:class:`edgebuild_msl.KernelSpec` and register them through ``edgebuild_register_custom_ops``;
edgebuild-msl checks, emulates and (on macOS) compiles them. It registers no op of its own.
"""
