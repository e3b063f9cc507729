"""``python -m benchmarks.fits``: launched fits at 2-32 ranks: set-up to the first batch and the step, against stock."""
