"""The coordinated stop on a preemption signal (``docs/stalls-and-preemption.md``)."""
