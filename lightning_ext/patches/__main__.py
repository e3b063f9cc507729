"""``python -m lightning_ext.patches check|apply|revert [--target DIR] [--series DIR]``.

Exit status: 0 on success (``check``: the series applies cleanly or is already applied), 1 when the series does not
fit the target or an error occurred (one line on stderr, nothing written), 2 for a usage error.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_ext.patches import PatchError, SeriesNotApplicableError, apply, check, revert

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); return the exit status."""
    parser = argparse.ArgumentParser(
        "python -m lightning_ext.patches", description="Check, apply or revert lightning-ext's patch series."
    )
    parser.add_argument(
        "command",
        choices=["check", "apply", "revert"],
        help="check: report hunk by hunk, write nothing; apply: all or nothing; revert: restore the original bytes",
    )
    parser.add_argument("--target", type=Path, metavar="DIR", help="a lightning package (default: the installed one)")
    parser.add_argument("--series", type=Path, metavar="DIR", help="the patches (default: lightning-<its version>)")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            print((report := check(target=args.target, series=args.series)).format())
            return 0 if report.ok else 1
        outcome = (apply if args.command == "apply" else revert)(target=args.target, series=args.series)
    except (PatchError, OSError) as exc:
        if isinstance(exc, SeriesNotApplicableError):
            print(exc.report.format())
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join([*(f"  wrote {path}" for path in outcome.written), outcome.message()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
