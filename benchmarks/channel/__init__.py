"""``python -m benchmarks.channel``: one hang check against ``barrier`` and a one-element ``all_reduce`` (gloo)."""
