"""The cross-rank decisions of ``ModelCheckpoint`` and ``EarlyStopping`` (see ``docs/architecture.md``)."""
