"""Every rank's own metrics file: written, read, checked and summarized (``docs/per-rank-metrics.md``)."""
