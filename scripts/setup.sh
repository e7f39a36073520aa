#!/usr/bin/env bash
# Everything a fresh machine needs, from the registries only: Java 17 and Maven
# (Debian) when missing, Chromium too with FLEETLOOP_SETUP_BROWSER=1 (the tests
# drive a web page in it), the Python environment (PyPI) and the Kafka broker
# jars (Maven Central). Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# the tests drive the live dashboards page in a real browser
if [ "${FLEETLOOP_SETUP_BROWSER:-0}" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
fi
if ((${#need_apt[@]})); then
  echo "[setup] installing ${need_apt[*]} from Debian"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "[setup] Python >= 3.11 is required (found $("$PYTHON" --version))" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "[setup] installing fleetloop and its test tools from PyPI"
.venv/bin/python -m pip install -q -e ".[test]"

echo "[setup] resolving the Kafka broker jars from Maven Central"
.venv/bin/fleetloop kafka fetch
