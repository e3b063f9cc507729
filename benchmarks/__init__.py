"""Benchmarks for lightning-ext: the communication overhead against stock Lightning (``python -m benchmarks.comm``).

Not part of the installed package: run from the repository root. See ``benchmarks/README.md``.
"""
