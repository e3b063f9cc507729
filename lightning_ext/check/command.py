"""``lightning-ext check PATH...`` (also ``python -m lightning_ext.check``): its arguments, output and exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lightning_ext.check.files import check_paths
from lightning_ext.check.output import as_json, as_text

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "main", "run"]

HELP = "find collective calls under a rank guard in Lightning code, before the job starts"

DESCRIPTION = (
    "Find collective calls that some ranks make and the others do not, before the job starts: a synced self.log,"
    " trainer.log_dir, trainer.save_checkpoint, a strategy's or torch.distributed's collective, or self.all_gather"
    " under a rank guard in a LightningModule or Callback, and synced keys that depend on the rank. Silence one line"
    " with `# noqa: CODE`. Exit codes: 0 nothing found, 1 findings, 2 a path or file that cannot be read or parsed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check's arguments, on ``parser`` (``lightning-ext check``'s or ``python -m lightning_ext.check``'s)."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files, or folders to walk for *.py files")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output (default: text)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check ``args.paths`` and print the findings; the exit code."""
    checked = check_paths(args.paths)
    for error in checked.errors:
        print(f"lightning-ext check: error: {error}", file=sys.stderr)
    if args.format == "json":
        print(as_json(checked.findings))
    else:
        for line in as_text(checked.findings):
            print(line)
        count = len(checked.findings)
        print(
            f"Found {count} finding(s) in {checked.files} file(s)." if count else f"{checked.files} file(s): all clear."
        )
    return 2 if checked.errors else 1 if checked.findings else 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m lightning_ext.check") -> int:
    """``python -m lightning_ext.check`` (and ``lightning-ext check``, as ``prog``): run the check; its exit code.

    Example:
        >>> main(["/no/such/file.py"])
        0 file(s): all clear.
        2

    """
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
