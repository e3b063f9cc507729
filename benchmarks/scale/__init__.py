"""``python -m benchmarks.scale``: per-rank metrics at cluster scale: reading, summarizing and writing."""
