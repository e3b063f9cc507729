"""``python -m lightning_ext.check PATH...``: the static check of Lightning code for rank-guarded collectives."""

from lightning_ext.check.command import main

if __name__ == "__main__":
    raise SystemExit(main())
