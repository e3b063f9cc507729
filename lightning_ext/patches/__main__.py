"""``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``: print the report(s).

Without ``--target``: every installed package (``lightning``, ``pytorch_lightning``); ``apply`` and ``revert`` write
only if each can take it. Exit status: 0 on success (``check``: ``apply`` would succeed), 1 when the series does not
fit or an error occurred (one line on stderr; nothing written), 2 for a usage error.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_ext.patches import PatchError, SeriesNotApplicableError, apply, check, revert
from lightning_ext.patches._tool import installed_targets

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
    parser = argparse.ArgumentParser("python -m lightning_ext.patches", description="Check, apply or revert.")
    parser.add_argument("command", choices=["check", "apply", "revert"], help="apply and revert: all or nothing")
    parser.add_argument(
        "--target", type=Path, metavar="DIR", help="a lightning or pytorch_lightning package (default: each installed)"
    )
    parser.add_argument("--series", type=Path, metavar="DIR", help="the patches (default: lightning-<its version>)")
    args = parser.parse_args(argv)
    try:
        targets = installed_targets() if args.target is None else (args.target,)
        reports = [check(target=target, series=args.series) for target in targets]
        if args.command != "check" and len(reports) > 1:  # all of them, or none: refuse before writing any
            for report in reports:
                if not (report.ok if args.command == "apply" else report.revertible):
                    raise SeriesNotApplicableError(args.command, report)
        if args.command != "check":
            action = {"apply": apply, "revert": revert}[args.command]
            reports = [action(target=target, series=args.series) for target in targets]
    except (PatchError, OSError) as exc:
        if isinstance(exc, SeriesNotApplicableError):
            print(exc.report.format())
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for number, report in enumerate(reports):
        print(
            *([""] if number else []),
            report.format(),
            *(f"{args.command}: wrote {p}" for p in report.written),
            sep="\n",
        )
        if args.command != "check":
            print(f"{args.command}: {len(report.written)} file(s) written in {report.target}")
    return 1 if args.command == "check" and not all(report.ok for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
