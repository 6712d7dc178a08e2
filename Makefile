# gpuadmin: three commands.
#   make run    install into .venv, migrate, start web + worker + scheduler on http://127.0.0.1:$(PORT)
#   make demo   the same, plus real processes on simulated GPUs and synthetic hosts (data in var/demo/)
#   make test   install, ruff check, mypy, the whole suite on SQLite, the tests that depend on the
#               database engine again on PostgreSQL, then the coverage of both (subprocesses
#               included) against its floor
# Also: make test-fast (the checks of make lint, then the suite on SQLite without the slow tier: no
# whole stack, real workers, browser or benchmarks; no coverage), make lint (ruff, mypy, the import
# floors), make clean.
# Variables: PORT (default 8000), PYTHON (default python3),
# PYTEST_ARGS (a subset: its coverage is reported, the floor is not applied), PYTEST_WORKERS
# (default 4; 0 runs each pass in one process).

PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
# Installing again only when pyproject.toml changed keeps `make run` quick.
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=
# Both passes run on pytest-xdist workers: most tests wait (servers, workers, browsers) rather than
# compute, so 4 workers pay off even on 2 cores. --dist load keeps each worker's tests in
# collection order, which pytest-django's ordering needs (tests/README.md: what runs in parallel,
# what stays serial, why); --maxschedchunk 1 hands out that order (longest first, tests/conftest.py)
# one test at a time as workers finish, so that they end together.
PYTEST_WORKERS ?= 4
XDIST := -n $(PYTEST_WORKERS) --dist load --maxschedchunk 1
# The slowest tests of each pass, at its end: where CI's time goes, in CI's own output.
DURATIONS := --durations=25 --durations-min=5

ifdef PORT
export PORT
endif

.PHONY: run demo test test-fast lint clean venv

run: $(INSTALLED)
	exec $(VENV_PYTHON) -m gpuadmin.run

demo: $(INSTALLED)
	exec $(VENV_PYTHON) -m gpuadmin.run --demo

# Both database runs happen even when the first fails, so one CI run shows everything.
# Coverage: every process writes its own data file under COVERAGE_FILE's folder (absolute,
# so processes started elsewhere write there too); [tool.coverage] in pyproject.toml has
# the rest, the floor (fail_under) included.
COVERAGE_DATA := $(CURDIR)/build/coverage
# Bytecode is written even where PYTHONDONTWRITEBYTECODE=1 (an empty value turns it off): without it every
# pytest worker rewrote the asserts of all ~250 test modules again (PostgreSQL pass under coverage: the
# first test 28 s after the start with nothing cached, 19 s with the SQLite pass's cache), and every
# process a test starts compiled gpuadmin again. __pycache__ is ignored by git.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=
COVERAGE := $(WRITE_BYTECODE) COVERAGE_FILE=$(COVERAGE_DATA)/.coverage $(VENV_PYTHON) -m coverage
test: $(INSTALLED)
	$(VENV_PYTHON) -m ruff check .
	$(VENV_PYTHON) -m mypy
	$(VENV)/bin/lint-imports --no-cache
	@status=0; rm -rf $(COVERAGE_DATA); mkdir -p $(COVERAGE_DATA); \
	echo "== pytest on SQLite"; $(COVERAGE) run -m pytest $(XDIST) $(DURATIONS) $(PYTEST_ARGS) || status=$$?; \
	echo "== engine tests on PostgreSQL"; $(COVERAGE) run tests/with_postgres.py -m engine $(XDIST) $(DURATIONS) || status=$$?; \
	echo "== coverage of both runs, subprocesses included"; \
	$(COVERAGE) combine --quiet && \
	$(COVERAGE) report $(if $(PYTEST_ARGS),--fail-under=0) || status=$$?; \
	if [ $$status -ne 0 ]; then echo "make test: FAILED (see above)" >&2; fi; \
	exit $$status

# The fast tier: what a change is checked with before `make test` (tests/README.md: the tiers).
test-fast: $(INSTALLED)
	$(VENV_PYTHON) -m ruff check .
	$(VENV_PYTHON) -m mypy
	$(VENV)/bin/lint-imports --no-cache
	$(WRITE_BYTECODE) $(VENV_PYTHON) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(VENV_PYTHON) -m ruff check .
	$(VENV_PYTHON) -m mypy
	$(VENV)/bin/lint-imports --no-cache

venv: $(VENV_PYTHON)

$(VENV_PYTHON):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "gpuadmin needs Python 3.11 or newer as '$(PYTHON)' (set PYTHON=... to pick another)." >&2; exit 1; }
	@$(PYTHON) -m venv $(VENV) || { \
	  rm -rf $(VENV); \
	  echo "" >&2; \
	  echo "Could not create $(VENV) with '$(PYTHON) -m venv'." >&2; \
	  echo "On Debian/Ubuntu install the venv module first:  sudo apt-get install python3-venv" >&2; \
	  exit 1; }

$(INSTALLED): pyproject.toml | $(VENV_PYTHON)
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@# LDAP sign-in's python-ldap builds against libldap: without it, everything else still runs.
	@$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test,ldap]' 2>/dev/null || \
	  echo "LDAP sign-in not installed (Debian: apt-get install libldap2-dev libsasl2-dev, then make again)." >&2
	@touch $@

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache *.egg-info
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	@echo "Kept var/ (the panel's database and secret key); remove it by hand to start over."
