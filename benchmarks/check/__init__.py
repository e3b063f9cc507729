"""The static check's benchmark: ``python -m benchmarks.check`` times ``lightning-ext check`` over Lightning's code."""
