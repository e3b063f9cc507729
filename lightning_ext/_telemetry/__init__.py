"""Per-rank telemetry: each batch timed by phase, memory sampled, the live straggler check."""
