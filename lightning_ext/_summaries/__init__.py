"""Summaries and pictures of every rank's files: spread, stragglers, host memory; pure."""
