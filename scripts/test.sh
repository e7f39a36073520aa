#!/usr/bin/env bash
# The test command: set-up, static checks, then the whole suite (unit tests and
# integration tests against a real Kafka broker that the suite starts itself,
# or KAFKA_BOOTSTRAP's). A run that collects no test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
FLEETLOOP_SETUP_BROWSER=1 bash scripts/setup.sh

echo "[test] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "[test] mypy"
.venv/bin/mypy
echo "[test] import contracts"
.venv/bin/lint-imports

echo "[test] pytest"
# A run that collects no test (pytest's exit code 5) fails.
run_pytest() {
  set +e
  .venv/bin/python -m pytest -p no:cacheprovider -ra "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests: failing" >&2
    return 1
  fi
  return "$rc"
}
if [ "$#" -gt 0 ]; then  # the tests named, in one run
  run_pytest --durations=25 "$@"
  exit $?
fi
# The unit tests are independent and CPU-bound (the property tests most of all): they run
# on every core (pytest-xdist, FLEETLOOP_TEST_WORKERS to choose). The integration tests
# start a broker and worker processes and wait on what those do: they run after, alone.
unit=0
run_pytest --durations=15 -n "${FLEETLOOP_TEST_WORKERS:-auto}" tests/unit || unit=$?
integration=0
run_pytest --durations=15 tests/integration || integration=$?
echo "[test] unit tests: exit $unit; integration tests: exit $integration"
[ "$unit" -eq 0 ] && [ "$integration" -eq 0 ]
