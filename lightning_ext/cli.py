"""The ``lightning-ext`` command line (also ``python -m lightning_ext``).

Commands:

* ``ranks LOG_DIR [--metric NAME ...] [--plot FILE.png] [--filename TEMPLATE]``: read the per-rank metrics files
  under ``LOG_DIR`` (a path or an fsspec URL such as ``s3://bucket/run``) and print, for each metric, every rank's
  last value, their min / max / std across ranks and the most outlying rank; ``--plot`` also draws the per-rank
  curves (needs ``pip install 'lightning-ext[plot]'``). A rank whose file stopped early is named in a warning line
  on stderr and in the summary line.

Exit codes: 0 success; 1 an error in the data (missing directory, malformed file, unknown metric), reported as one
line on stderr; 2 a usage error, or ``--plot`` without matplotlib.

Example:
    >>> main(["ranks", "/no/such/dir"])
    1

"""

import argparse
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_ext.rank_metrics import DEFAULT_FILENAME, incomplete_ranks, read_rank_metrics
from lightning_ext.rank_spread import format_spread, plot_rank_curves, summarize_spread

__all__ = ["main"]

_PROG = "lightning-ext"
_PLOT_HINT = "pip install 'lightning-ext[plot]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (usage errors exit with code 2 through argparse).

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` if ``None``.

    """
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description="Tools for PyTorch Lightning runs under DDP.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ranks = commands.add_parser(
        "ranks",
        help="how far the ranks' metrics drift apart",
        description="For each metric: every rank's last value, their min / max / std across ranks, and the rank"
        " farthest from their median.",
    )
    ranks.add_argument(
        "log_dir", metavar="LOG_DIR", help="the directory that holds rank_<r>/metrics.csv (a path or an fsspec URL)"
    )
    ranks.add_argument(
        "--metric",
        dest="metrics",
        metavar="NAME",
        action="extend",
        nargs="+",
        help="only these metrics (repeat the option or list several names); default: all",
    )
    ranks.add_argument("--plot", metavar="FILE.png", type=Path, help=f"also draw per-rank curves ({_PLOT_HINT})")
    ranks.add_argument(
        "--filename",
        default=DEFAULT_FILENAME,
        metavar="TEMPLATE",
        help=f"each rank's file, relative to LOG_DIR, with {{rank}} for the rank (default: {DEFAULT_FILENAME})",
    )
    ranks.set_defaults(run=_run_ranks)
    return parser


def _run_ranks(args: argparse.Namespace) -> int:
    if args.plot is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            print(f"{_PROG} ranks: --plot needs matplotlib: {_PLOT_HINT}", file=sys.stderr)
            return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            incomplete = incomplete_ranks(args.log_dir, filename=args.filename)
            table = read_rank_metrics(args.log_dir, filename=args.filename)
        for warning in caught:
            print(f"{_PROG} ranks: warning: {warning.message}", file=sys.stderr)
        summary = summarize_spread(table, metrics=args.metrics)
        ranks = table["rank"].nunique()
        stopped = f", incomplete: rank {', '.join(map(str, incomplete))}" if incomplete else ""
        print(f"{args.log_dir}: {ranks} rank(s), {len(table)} row(s), {len(summary)} metric(s){stopped}")
        if len(summary):
            print(format_spread(summary))
        if args.plot is not None:
            plot_rank_curves(table, args.plot, metrics=args.metrics)
            print(f"wrote {args.plot}")
    except (OSError, ValueError) as error:  # FileNotFoundError, RankMetricsError, an unknown metric
        print(f"{_PROG} ranks: error: {error}", file=sys.stderr)
        return 1
    return 0
