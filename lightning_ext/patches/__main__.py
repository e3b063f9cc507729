"""``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``.

Exit status: 0 on success (``check``: the series applies cleanly or is already applied; ``apply``/``revert``: done,
or nothing to do), 1 when the series does not fit the target or an error occurred (one line on stderr, nothing
written), 2 for a usage error.

"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_ext.patches._api import apply, check, revert
from lightning_ext.patches._errors import PatchError, SeriesNotApplicableError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` by default.

    """
    args = _parser().parse_args(argv)
    options = {"target": args.target, "series": args.series}
    try:
        if args.command == "check":
            report = check(**options)
            print(report.format())
            return 0 if report.ok else 1
        outcome = apply(**options) if args.command == "apply" else revert(**options)
    except SeriesNotApplicableError as exc:
        print(exc.report.format())
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (PatchError, OSError, UnicodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in outcome.written:
        print(f"  wrote {path}")
    print(outcome.message())
    return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--target",
        type=Path,
        metavar="DIR",
        help="the 'lightning' package directory to patch (default: the installed one)",
    )
    common.add_argument(
        "--series",
        type=Path,
        metavar="DIR",
        help="the directory of NNNN-*.patch files (default: <repository>/patches/lightning-<target version>)",
    )
    parser = argparse.ArgumentParser(
        prog="python -m lightning_ext.patches",
        description="Check, apply or revert lightning-ext's patch series on a Lightning installation.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "check": "simulate the series in memory and report hunk by hunk; writes nothing",
        "apply": "apply the whole series, all-or-nothing (nothing to do if already applied)",
        "revert": "restore the original files byte for byte, all-or-nothing (nothing to do if not applied)",
    }
    for name, text in helps.items():
        commands.add_parser(name, parents=[common], help=text, description=text)
    return parser


if __name__ == "__main__":
    sys.exit(main())
