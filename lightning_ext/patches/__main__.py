"""``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``: print the report.

Exit status: 0 on success (``check``: ``apply`` would succeed), 1 when the series does not fit the target or an
error occurred (one line on stderr; nothing written), 2 for a usage error.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_ext.patches import PatchError, SeriesNotApplicableError, apply, check, revert

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
    parser = argparse.ArgumentParser("python -m lightning_ext.patches", description="Check, apply or revert.")
    parser.add_argument("command", choices=["check", "apply", "revert"], help="apply and revert: all or nothing")
    parser.add_argument("--target", type=Path, metavar="DIR", help="a lightning package (default: the installed one)")
    parser.add_argument("--series", type=Path, metavar="DIR", help="the patches (default: lightning-<its version>)")
    args = parser.parse_args(argv)
    try:
        action = {"check": check, "apply": apply, "revert": revert}[args.command]
        report = action(target=args.target, series=args.series)
    except (PatchError, OSError) as exc:
        if isinstance(exc, SeriesNotApplicableError):
            print(exc.report.format())
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report.format(), *(f"{args.command}: wrote {path}" for path in report.written), sep="\n")
    if args.command != "check":
        print(f"{args.command}: {len(report.written)} file(s) written in {report.target}")
    return 1 if args.command == "check" and not report.ok else 0


if __name__ == "__main__":
    sys.exit(main())
