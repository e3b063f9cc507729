"""``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``.

Exit status: 0 on success (``check``: the series applies cleanly or is already applied), 1 when the series does not
fit the target or an error occurred (one line on stderr, nothing written), 2 for a usage error.

"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_ext.patches._api import apply, check, revert
from lightning_ext.patches._report import SeriesNotApplicableError
from lightning_ext.patches._series import PatchError

__all__ = ["main"]

_COMMANDS = {
    "check": "report hunk by hunk whether the series applies; writes nothing",
    "apply": "apply the whole series or nothing (nothing to do if already applied)",
    "revert": "restore the original files byte for byte (nothing to do if not applied)",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lightning_ext.patches", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", type=Path, metavar="DIR", help="the lightning package (default: the installed one)")
    common.add_argument("--series", type=Path, metavar="DIR", help="the patches (default: the bundled series)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in _COMMANDS.items():
        commands.add_parser(name, parents=[common], help=text, description=text)
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            report = check(target=args.target, series=args.series)
            print(report.format())
            return 0 if report.ok else 1
        outcome = (apply if args.command == "apply" else revert)(target=args.target, series=args.series)
    except SeriesNotApplicableError as exc:
        print(exc.report.format())
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (PatchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join([*(f"  wrote {path}" for path in outcome.written), outcome.message()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
