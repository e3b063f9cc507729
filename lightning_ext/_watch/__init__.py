"""What a rank knows of itself (its calls, progress, signals) and the watchdog thread that answers for it."""
