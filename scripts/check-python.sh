#!/usr/bin/env bash
# The Python SDK (sdk/python, docs/python.md): the pinned packages of sdk/python/requirements.txt
# go into a venv under .tools/ the first time, and again whenever the pins change; then the
# package itself is built from this checkout (its stubs generated from proto/ with the pinned
# grpcio-tools) and its unit tests and its tests against a real `hermes up` run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.tools/python-venv"
requirements="$root/sdk/python/requirements.txt"
# The tests' Standard Webhooks verifier, pinned by hash (pip's hash mode is all or nothing, so
# it is a file and an install of its own).
hashed="$root/sdk/python/requirements-webhooks.txt"
stamp="$venv/.requirements"
if ! cat "$requirements" "$hashed" | cmp -s - "$stamp" \
  || ! "$venv/bin/python" -c "import grpc_tools, nats, standardwebhooks" 2>/dev/null; then
  echo "installing the pinned packages of the Python SDK into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$hashed"
  cat "$requirements" "$hashed" > "$stamp"
fi
# No build isolation: the build uses the pinned setuptools and grpcio-tools of the venv.
rm -rf "$root/sdk/python/build"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall \
  "$root/sdk/python"
export HERMES_BIN_DIR="${HERMES_BIN_DIR:-$root/target/debug}"
export HERMES_NATS_SERVER_BIN="${HERMES_NATS_SERVER_BIN:-$root/.tools/bin/nats-server}"
cd "$root/sdk/python/tests"
exec "$venv/bin/python" -m unittest discover -s . -p 'test_*.py' -v
