"""The ``edgebuild`` command: a repeated build that is up to date is answered before the CLI loads."""

import sys


def main() -> None:
    from edgebuild.store import uptodate

    argv = sys.argv[1:]
    code = uptodate.replay(argv)
    if code is not None:
        sys.exit(code)
    uptodate.entry_argv = argv
    from edgebuild.cli.app import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
