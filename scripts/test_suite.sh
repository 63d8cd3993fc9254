#!/usr/bin/env bash
# `make test`'s pytest runs: the suite's two parts at the same time.
#
# The dbt tests keep the two cores busy (94% of them, measured: Spark's planning and dbt's Jinja) and run in
# DBT_WORKERS processes of their own, since dbt's session adapter shares its process's SparkSession. The other
# tests (broker, ingest, CLI) mostly wait, on group sessions, timeouts and child processes (33% of two cores when
# they ran alone, 6.8 minutes): they run beside them in one process, which logs to a file printed (and removed)
# at the end.
#
# Usage: scripts/test_suite.sh [PYTEST_ARGS...]   Env: PY (the venv's python), DBT_WORKERS (default 2).
set -uo pipefail

PY="${PY:-.venv/bin/python}"
DBT_WORKERS="${DBT_WORKERS:-2}"
# The live PostgreSQL test on its embedded setup (a private cluster, the real Debezium engine, the embedded broker;
# ~20 s): the one live source that needs no server of the user's (tests/test_live_sources.py).
export CDCLAKE_TEST_POSTGRES_DSN="${CDCLAKE_TEST_POSTGRES_DSN:-embedded}"
log="$(mktemp -t cdclake-tests-XXXXXX.log)"

echo "tests without dbt: running beside the dbt tests, logged to $log (printed when both are done)"
# A script's background job ignores SIGINT unless told otherwise: Ctrl-C must reach both parts, so that each pytest
# stops and tears its fixtures down (brokers, JVMs). Stopped with SIGTERM, this script interrupts it likewise.
( trap - INT; exec "$PY" -m pytest -m "not dbt and not slow" --durations=15 "$@" >"$log" 2>&1 ) &
others=$!
trap 'wait "$others"; exit 130' INT
trap 'kill -INT "$others" 2>/dev/null; wait "$others"; exit 143' TERM

# Whole modules, longest first (tests/conftest.py, DBT_MODULES_LONGEST_FIRST).
"$PY" -m pytest -m "dbt and not slow" -n "$DBT_WORKERS" --dist loadfile --no-loadscope-reorder --durations=15 "$@"
dbt_status=$?
wait "$others"
others_status=$?
trap - INT TERM

echo
echo "==================== tests without dbt ($log) ===================="
cat "$log"
rm -f "$log"
echo "tests without dbt: exit $others_status; dbt tests: exit $dbt_status"
# pytest exits 5 when nothing was selected (a PYTEST_ARGS that names one part's tests): not a failure of the other.
for status in "$others_status" "$dbt_status"; do
  if [[ "$status" -ne 0 && "$status" -ne 5 ]]; then exit "$status"; fi
done
if [[ "$others_status" -eq 5 && "$dbt_status" -eq 5 ]]; then exit 5; fi
exit 0
