"""The set-up mistakes caught before the first batch, on every rank alike (``docs/setup-checks.md``)."""
