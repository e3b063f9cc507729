# The two entry points the README opens with. Both set up .venv first (idempotent).
.PHONY: demo test setup lint typecheck

setup:
	scripts/bootstrap.sh

demo: setup
	.venv/bin/python -m lightning_ext.demo

test: setup
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/python -m ruff check lightning_ext tests benchmarks
	.venv/bin/python -m ruff format --check lightning_ext tests benchmarks

typecheck: setup
	.venv/bin/python -m mypy lightning_ext benchmarks
