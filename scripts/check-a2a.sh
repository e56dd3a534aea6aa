#!/usr/bin/env bash
# The A2A endpoint against an independent client: the official `a2a-sdk` Python package, pinned
# with everything it pulls in (tests/a2a/requirements.txt), driving a real `hermes up`
# (tests/a2a/test_a2a_sdk.py). The packages go into a venv under .tools/ the first time, and
# again whenever the pins change.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.tools/a2a-venv"
requirements="$root/tests/a2a/requirements.txt"
stamp="$venv/.requirements"
if ! cmp -s "$requirements" "$stamp" || ! "$venv/bin/python" -c "import a2a.client" 2>/dev/null; then
  echo "installing the pinned a2a-sdk into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi
export HERMES_BIN_DIR="${HERMES_BIN_DIR:-$root/target/debug}"
export HERMES_NATS_SERVER_BIN="${HERMES_NATS_SERVER_BIN:-$root/.tools/bin/nats-server}"
cd "$root/tests/a2a"
exec "$venv/bin/python" -m unittest discover -s . -p 'test_*.py' -v
