"""``python -m lightning_ext``: the command line of :mod:`lightning_ext.cli`."""

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. ``check`` starts without the other commands' imports (pandas, ...): pre-commit
    runs it on every commit."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["check"]:
        from lightning_ext.check.command import main as check

        return check(arguments[1:], prog="lightning-ext check")
    from lightning_ext.cli import main as commands

    return commands(arguments)


if __name__ == "__main__":
    raise SystemExit(main())
