"""The synced-logging benchmark: coalesced synced logging against stock Lightning's sync per value."""
