#!/usr/bin/env bash
# The main job: set-up, then a live demo of the pipeline on embedded defaults
# (local Kafka broker, simulated node agents, a stream worker owning an
# embedded ClickHouse), ending with a summary read back from ClickHouse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fleetloop demo "$@"
