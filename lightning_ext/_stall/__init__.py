"""The stall report: a stalled group noticed, the rank behind named, the run ended (docs/stalls-and-preemption.md)."""
