"""The hang checks: every rank at the same collective, or the same error on every rank (``docs/hang-checks.md``)."""
