#!/usr/bin/env bash
# Offline checks of deploy/ and helm/hermes (the Python tests in tests/deploy): the chart rendered
# and linted with the Helm library (PyPI helm-python-sdk), its manifests validated against the
# Kubernetes schemas (PyPI kubernetes-validate), docker-compose.yml and the chart checked against
# the built binaries' --help, the NATS config parsed by the pinned nats-server, and the HTTP API's
# OpenAPI document, served by a real `hermes up`, validated (PyPI openapi-spec-validator). The
# packages go into a venv under .tools/ the first time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.tools/deploy-venv"
packages=("helm-python-sdk==0.2.2" "kubernetes-validate==1.37.0" "PyYAML==6.0.4" "openapi-spec-validator==0.7.2")
if ! "$venv/bin/python" -c "import helm_python, kubernetes_validate, yaml, openapi_spec_validator" 2>/dev/null; then
  echo "installing ${packages[*]} into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi
export HERMES_BIN_DIR="${HERMES_BIN_DIR:-$root/target/debug}"
export HERMES_NATS_SERVER_BIN="${HERMES_NATS_SERVER_BIN:-$root/.tools/bin/nats-server}"
cd "$root/tests/deploy"
exec "$venv/bin/python" -m unittest discover -s . -p 'test_*.py' -v
