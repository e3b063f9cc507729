# The two entry points the README opens with. Both set up .venv first (idempotent).
.PHONY: demo test test-lightning-2.5 setup setup-lightning-2.5 lint typecheck

# The verified Lightning releases (lightning_ext/strategies/_compat.py VERIFIED): .venv holds the newest, the README's default.
LIGHTNING := 2.6.6
LIGHTNING_25 := 2.5.6
VENV_25 := .venv-lightning-2.5

# The core suite, what CI also runs against Lightning 2.5.6: every test and doctest but those that run once, under
# `make test`: the comm benchmark's smoke runs (tests/benchmarks/test_comm.py), the wheel build, and the launched
# demonstrations that stock Lightning itself hangs on each pitfall (marker `stock`: the reference for our errors, not
# lightning-ext's behaviour). It includes the 2.5.6 patch series applied and run natively (tests/patches/test_native.py).
CORE := --ignore=tests/benchmarks/test_comm.py -m "not stock" \
	--deselect tests/patches/test_tool.py::test_the_built_wheel_ships_the_series_and_the_installed_tool_checks_it

setup:
	scripts/bootstrap.sh .venv $(LIGHTNING)

demo: setup
	.venv/bin/python -m lightning_ext.demo

test: setup
	.venv/bin/python -m pytest

setup-lightning-2.5:
	scripts/bootstrap.sh $(VENV_25) $(LIGHTNING_25)

test-lightning-2.5: setup-lightning-2.5
	$(VENV_25)/bin/python -m pytest $(CORE)

# ruff; the architecture's import contracts (pyproject.toml [tool.importlinter], docs/architecture.md); dead code
lint: setup
	.venv/bin/python -m ruff check lightning_ext tests benchmarks
	.venv/bin/python -m ruff format --check lightning_ext tests benchmarks
	.venv/bin/lint-imports
	.venv/bin/python -m vulture

typecheck: setup
	.venv/bin/python -m mypy lightning_ext benchmarks
