"""``python -m lightning_ext``: the command line of :mod:`lightning_ext.cli`."""

from lightning_ext.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
