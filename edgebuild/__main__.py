"""The ``edgebuild`` command: a repeated build that is up to date is answered before the CLI loads."""

import sys


def skip_collections_at_exit() -> None:
    """Let the interpreter's shutdown skip its garbage collections over everything still loaded.

    At exit CPython collects while it tears the modules down, walking every object of the
    libraries a build loaded (onnx, sympy, coremltools: over half a second of a fp16 conversion's
    wall time) only to free memory the process is giving back anyway. ``gc.freeze`` as the last
    exit handler puts them out of those collections' reach; the other handlers (temporary
    directories, coremltools' temporary packages) still run first, and standard streams are still
    flushed.
    """
    import atexit
    import gc

    atexit.register(gc.freeze)  # registered first, so it runs last


def main() -> None:
    skip_collections_at_exit()
    from edgebuild.build import uptodate

    argv = sys.argv[1:]
    code = uptodate.replay(argv)
    if code is not None:
        sys.exit(code)
    uptodate.entry_argv = argv
    from edgebuild.cli.app import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
