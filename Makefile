# The two entry points the README opens with. Both set up .venv first (idempotent).
.PHONY: demo test test-ci test-fast test-scale test-lightning-2.5 test-ci-lightning-2.5 setup setup-lightning-2.5 lint typecheck ci mutation

# The verified Lightning releases (lightning_ext/strategies/_compat.py VERIFIED): .venv holds the newest, the README's default.
LIGHTNING := 2.6.6
LIGHTNING_25 := 2.5.6
VENV_25 := .venv-lightning-2.5

# The core suite, what CI also runs against Lightning 2.5.6: every test and doctest but those that run once, under
# `make test`: the comm benchmark's smoke runs (tests/benchmarks/test_comm.py), the wheel build, and the launched
# demonstrations that stock Lightning itself hangs on each pitfall (marker `stock`: the reference for our errors, not
# lightning-ext's behaviour). It includes the 2.5.6 patch series applied and run natively (tests/patches/test_native.py).
# As under 2.6.6, it runs in two parts: `make test-lightning-2.5` (but the tests marked `ci`), then
# `make test-ci-lightning-2.5` (those); CI runs both.
CORE := --ignore=tests/benchmarks/test_comm.py \
	--deselect tests/patches/test_tool.py::test_the_built_wheel_ships_the_series_and_the_installed_tool_checks_it

# pytest-xdist: the suite on 4 workers, each test file on one (its module-scoped jobs and fixtures stay together, and
# a file's launched jobs are started once). More workers than the 2 cores: launched jobs spend much of their time
# waiting (a check's first look after 2 s, a stall's threshold, stock's hangs), and so do the rank pools' ranks.
PARALLEL := -n 4 --dist loadfile

setup:
	scripts/bootstrap.sh .venv $(LIGHTNING)

demo: setup
	.venv/bin/python -m lightning_ext.demo

# every test but those marked `ci` (launched jobs, benchmark smoke runs, the patch series run natively: their
# processes' start-up alone is minutes of CPU on two cores) and `scale` (launched jobs of 16 ranks: make test-scale)
test: setup
	.venv/bin/python -m pytest $(PARALLEL) -m "not ci and not scale"

# what `make test` leaves to CI: the tests marked `ci`
test-ci: setup
	.venv/bin/python -m pytest $(PARALLEL) -m "ci and not scale"

# The launched jobs of 16 ranks (tests/checks/test_sixteen_ranks.py): 16 processes each, one job at a time (no xdist:
# two would hold 32 ranks on the machine). 2 min 10 s on an idle 2-core machine, 24 min on a loaded slower one, so CI
# runs only the founding pitfall's job (marker `ci`), the rest are marked `scale`: run this when the checks' channel,
# the lockstep or a first line changes.
test-scale: setup
	.venv/bin/python -m pytest tests/checks/test_sixteen_ranks.py

setup-lightning-2.5:
	scripts/bootstrap.sh $(VENV_25) $(LIGHTNING_25)

test-lightning-2.5: setup-lightning-2.5
	$(VENV_25)/bin/python -m pytest $(PARALLEL) $(CORE) -m "not stock and not scale and not ci"

test-ci-lightning-2.5: setup-lightning-2.5
	$(VENV_25)/bin/python -m pytest $(PARALLEL) $(CORE) -m "ci and not stock and not scale"

# The edit loop: the pure and in-process tests (no rank pool, no launched DDP job, no Trainer on several processes).
test-fast: setup
	.venv/bin/python -m pytest -n 2 --dist loadfile -m "not slow and not pool and not stock and not ci and not scale"

# ruff; the architecture's import contracts (pyproject.toml [tool.importlinter], docs/architecture.md); dead code
lint: setup
	.venv/bin/python -m ruff check lightning_ext tests benchmarks scripts
	.venv/bin/python -m ruff format --check lightning_ext tests benchmarks scripts
	.venv/bin/lint-imports
	.venv/bin/python -m vulture

typecheck: setup
	.venv/bin/python -m mypy lightning_ext benchmarks scripts/mutation.py

# What CI runs (.ci/run), each step timed there: the README's test command and the tests it leaves to CI, lint,
# typecheck, the 2.5.6 core suite in its two parts.
ci: test test-ci lint typecheck test-lightning-2.5 test-ci-lightning-2.5

# Mutation testing of the pure rule modules against their fast tests (scripts/mutation.py, docs/testing.md): each
# module's kill ratio and survivors; fails under 90% in a module. Not part of CI: run it when a rule changes.
mutation: setup
	.venv/bin/python scripts/mutation.py
