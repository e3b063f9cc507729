"""``python -m benchmarks.comm``: the decisions', the checks' and the per-rank files' cost against stock Lightning."""
