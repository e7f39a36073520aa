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
set +e
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
