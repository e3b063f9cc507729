"""Synced logged values, held until a point every rank reaches and synced there together."""
