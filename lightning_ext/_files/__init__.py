"""Files that must never stop a run: crash-safe appends, object stores, markers, the CSV format."""
