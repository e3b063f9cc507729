"""Every rank's files read back: listed, checked to come from one run, parsed fast into one table."""
